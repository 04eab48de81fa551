#include "alloc/static_layout.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <map>
#include <numeric>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

namespace ht {
namespace {

bool conflicts_with_nothing(const LayoutBlock& b) { return b.bytes <= 0 || b.begin >= b.end; }

enum class Gap { kBestFit, kFirstFit };

// The placed blocks in address order, a vector per field: finding those live with a new block
// is a branch-free pass over two arrays (a branch per block mispredicts often, and made the
// packer twice as slow), then a pass over those alone.
class AddressOrder {
 public:
  void insert(int64_t offset, const LayoutBlock& b) {
    const auto at = std::upper_bound(offset_.begin(), offset_.end(), offset) - offset_.begin();
    offset_.insert(offset_.begin() + at, offset);
    end_offset_.insert(end_offset_.begin() + at, offset + b.bytes);
    begin_.insert(begin_.begin() + at, b.begin);
    end_.insert(end_.begin() + at, b.end);
  }

  // Where `b` goes: the gaps between the blocks live with it are the candidates. Best fit takes
  // the smallest gap that holds it, which keeps large gaps for the large blocks still to come
  // at a size; first fit takes the lowest. Either falls back to just above the highest.
  int64_t choose(const LayoutBlock& b, Gap rule) {
    const size_t n = offset_.size();
    live_.resize(n);
    size_t k = 0;
    for (size_t i = 0; i < n; ++i) {
      live_[k] = static_cast<uint32_t>(i);
      k += static_cast<size_t>((begin_[i] < b.end) & (end_[i] > b.begin));
    }
    int64_t cursor = 0;  // the lowest address not covered by a live block seen so far
    int64_t best = -1;
    int64_t best_gap = std::numeric_limits<int64_t>::max();
    for (size_t j = 0; j < k; ++j) {
      const size_t i = live_[j];
      const int64_t gap = offset_[i] - cursor;
      if (gap >= b.bytes && gap < best_gap) {
        best = cursor;
        best_gap = gap;
        if (rule == Gap::kFirstFit) return best;
      }
      cursor = std::max(cursor, end_offset_[i]);
    }
    return best >= 0 ? best : cursor;
  }

 private:
  std::vector<int64_t> offset_, end_offset_, begin_, end_;
  std::vector<uint32_t> live_;  // scratch: indices of the blocks live with the one placed
};

Layout pack_with(const std::vector<LayoutBlock>& blocks, const std::vector<PlacedBlock>& fixed,
                 const std::vector<size_t>& order, Gap rule) {
  AddressOrder placed;
  for (const PlacedBlock& f : fixed) {
    if (!conflicts_with_nothing(f.block)) placed.insert(f.offset, f.block);
  }
  Layout layout;
  layout.offsets.assign(blocks.size(), 0);
  for (size_t i : order) {
    const LayoutBlock& b = blocks[i];
    if (conflicts_with_nothing(b)) continue;  // offset 0: it shares with everything
    const int64_t offset = placed.choose(b, rule);
    layout.offsets[i] = offset;
    layout.peak_bytes = std::max(layout.peak_bytes, offset + b.bytes);
    placed.insert(offset, b);
  }
  return layout;
}

}  // namespace

Layout pack_blocks(const std::vector<LayoutBlock>& blocks, const std::vector<PlacedBlock>& fixed) {
  // Largest first; among equals the longest lived, then the earliest, then input order, so the
  // result depends on the input alone.
  std::vector<size_t> order(blocks.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    const LayoutBlock& a = blocks[x];
    const LayoutBlock& b = blocks[y];
    if (a.bytes != b.bytes) return a.bytes > b.bytes;
    if (a.end - a.begin != b.end - b.begin) return a.end - a.begin > b.end - b.begin;
    if (a.begin != b.begin) return a.begin < b.begin;
    return x < y;
  });
  // Neither rule wins on every input, and packing is cheap next to the step it plans: keep
  // the lower of the two.
  Layout best = pack_with(blocks, fixed, order, Gap::kBestFit);
  Layout first = pack_with(blocks, fixed, order, Gap::kFirstFit);
  return first.peak_bytes < best.peak_bytes ? first : best;
}

int64_t live_bytes_lower_bound(const std::vector<LayoutBlock>& blocks) {
  std::vector<std::pair<int64_t, int64_t>> events;  // (time, +bytes or -bytes)
  events.reserve(2 * blocks.size());
  for (const LayoutBlock& b : blocks) {
    if (conflicts_with_nothing(b)) continue;
    events.emplace_back(b.begin, b.bytes);
    events.emplace_back(b.end, -b.bytes);
  }
  // At one time, frees (negative) sort before allocations: the intervals are half-open.
  std::sort(events.begin(), events.end());
  int64_t live = 0;
  int64_t peak = 0;
  for (const auto& e : events) {
    live += e.second;
    peak = std::max(peak, live);
  }
  return peak;
}

std::optional<Overlap> find_overlap(const std::vector<LayoutBlock>& blocks, const std::vector<int64_t>& offsets) {
  if (blocks.size() != offsets.size()) {
    throw std::invalid_argument("find_overlap: " + std::to_string(blocks.size()) + " blocks but " +
                                std::to_string(offsets.size()) + " offsets");
  }
  // (time, 0 for a free or 1 for an allocation, block): frees first at equal times.
  std::vector<std::tuple<int64_t, int, size_t>> events;
  events.reserve(2 * blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (conflicts_with_nothing(blocks[i])) continue;
    events.emplace_back(blocks[i].begin, 1, i);
    events.emplace_back(blocks[i].end, 0, i);
  }
  std::sort(events.begin(), events.end());
  // The live blocks by (offset, index). While they are disjoint, a new one can only overlap a
  // neighbour in address order, so two lookups per allocation check it against all of them.
  std::map<std::pair<int64_t, size_t>, size_t> live;
  const auto overlap = [&](size_t a, size_t b) {
    const auto describe = [&](size_t i) {
      return "block " + std::to_string(i) + " [" + std::to_string(offsets[i]) + ", " +
             std::to_string(offsets[i] + blocks[i].bytes) + ") live [" + std::to_string(blocks[i].begin) +
             ", " + std::to_string(blocks[i].end) + ")";
    };
    return Overlap{std::min(a, b), std::max(a, b), describe(std::min(a, b)) + " overlaps " + describe(std::max(a, b))};
  };
  for (const auto& [time, is_allocation, i] : events) {
    const std::pair<int64_t, size_t> key{offsets[i], i};
    if (is_allocation == 0) {
      live.erase(key);
      continue;
    }
    const auto it = live.emplace(key, i).first;
    if (it != live.begin()) {
      const size_t before = std::prev(it)->second;
      if (offsets[before] + blocks[before].bytes > offsets[i]) return overlap(before, i);
    }
    const auto next = std::next(it);
    if (next != live.end() && offsets[next->second] < offsets[i] + blocks[i].bytes) return overlap(i, next->second);
  }
  return std::nullopt;
}

}  // namespace ht

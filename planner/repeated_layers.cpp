#include "planner/repeated_layers.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <stdexcept>
#include <utility>

namespace ht {
namespace {

enum class Pass : uint8_t { kOutside, kForward, kBackward };

// A run of events from the first kernel of a block's forward (or backward) to the next such
// beginning; the events before the first block's first kernel are one segment outside them. The
// loss's kernels (no block) stay in the segment they fall in.
struct Segment {
  Pass pass = Pass::kOutside;
  int block = -1;
  size_t begin = 0, end = 0;
  int tensors = 0, kernels = 0;  // created in it: allocated, begun
};

// Where a tensor or kernel was created: its segment, and its place among what that segment created.
struct Origin {
  int segment = -1;
  int local = -1;
};

struct NotRepeatable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Segments {
  std::vector<Segment> list;
  std::vector<Origin> tensor, kernel;

  explicit Segments(const StepTrace& t) {
    list.emplace_back();
    std::set<std::pair<Pass, int>> seen;
    for (size_t i = 0; i < t.events.size(); ++i) {
      const TraceEvent& e = t.events[i];
      if (e.kind != TraceEvent::Kind::kKernelBegins) continue;
      const TraceKernel& k = t.kernels[static_cast<size_t>(e.index)];
      const Pass pass = k.backward ? Pass::kBackward : Pass::kForward;
      if (k.block < 0 || (list.back().pass == pass && list.back().block == k.block)) continue;
      if (!seen.insert({pass, k.block}).second)
        throw NotRepeatable("block " + std::to_string(k.block) + "'s " + (k.backward ? "backward" : "forward") +
                            " kernels are not one run");
      list.back().end = i;
      list.push_back({pass, k.block, i, i, 0, 0});
    }
    list.back().end = t.events.size();
    tensor.assign(t.tensors.size(), {});
    kernel.assign(t.kernels.size(), {});
    for (size_t g = 0; g < list.size(); ++g) {
      Segment& s = list[g];
      for (size_t i = s.begin; i < s.end; ++i) {
        const TraceEvent& e = t.events[i];
        if (e.kind == TraceEvent::Kind::kAllocated) tensor[static_cast<size_t>(e.index)] = {static_cast<int>(g), s.tensors++};
        if (e.kind == TraceEvent::Kind::kKernelBegins) kernel[static_cast<size_t>(e.index)] = {static_cast<int>(g), s.kernels++};
      }
    }
  }
};

// The deep trace, written segment by segment: each shallow segment once, the repeated layer's
// once per copy (forward in order, backward in reverse), indices given in the order the events
// create them, as the recorder gives them.
class Stretch {
 public:
  Stretch(const StepTrace& in, const LayerRepeat& r) : in_(in), r_(r), segments_(in) {
    for (const auto& [block, buckets] : r.shallow_buckets)
      for (size_t rank = 0; rank < buckets.size(); ++rank) bucket_place_[buckets[rank]] = {block, static_cast<int>(rank)};
  }

  StepTrace run() {
    StepTrace out;
    out.persistent_bytes = in_.persistent_bytes;
    for (size_t g = 0; g < segments_.list.size(); ++g) {
      const Segment& s = segments_.list[g];
      if (s.pass != Pass::kOutside && s.block == r_.repeated()) {
        for (int c = 0; c <= r_.added(); ++c) {
          emit(static_cast<int>(g), s.pass == Pass::kForward ? r_.repeated() + c : r_.repeated() + r_.added() - c, out);
        }
      } else {
        emit(static_cast<int>(g), s.pass == Pass::kOutside ? -1 : deep_block(s.block), out);
      }
    }
    return out;
  }

 private:
  // A segment written for one deep block: what it created, by its place in the segment.
  struct Instance {
    int segment;
    int block;
    std::vector<int> tensors, kernels;
  };

  bool is_layer(int b) const { return b >= r_.first && b < r_.first + r_.layers; }
  // A shallow block that is not copied, in the deep model (the first copy is the original).
  int deep_block(int b) const { return b <= r_.repeated() ? b : b + r_.added(); }

  // The deep block shallow block `b` stands for, read from an instance of shallow block `from`
  // written as deep block `as`: a layer beside a layer is the one beside the copy.
  int map_block(int b, int from, int as) const {
    if (b < 0) return b;
    if (is_layer(b) && is_layer(from)) {
      if (std::abs(b - from) > 1)
        throw NotRepeatable("layer block " + std::to_string(from) + " reads block " + std::to_string(b) + ", not beside it");
      return as + (b - from);
    }
    if (b == r_.repeated()) throw NotRepeatable("block " + std::to_string(from) + " reads the copied layer");
    return deep_block(b);
  }

  // The instance holding what `o` names, read from `from`; `copy`: the copy of the repeated layer
  // a block that is not a layer means (its frees of every layer's casts).
  Instance& target(const Origin& o, const Instance& from, int copy = -1) {
    const Segment& x = segments_.list[static_cast<size_t>(o.segment)];
    const int block = x.pass == Pass::kOutside ? -1
                      : copy >= 0              ? r_.repeated() + copy
                                               : map_block(x.block, segments_.list[static_cast<size_t>(from.segment)].block, from.block);
    auto it = instance_of_.find({x.pass, block});
    if (it == instance_of_.end()) throw NotRepeatable("a reference to deep block " + std::to_string(block) + " before it runs");
    return instances_[it->second];
  }
  int tensor(int index, const Instance& from, int copy = -1) {
    const Origin o = segments_.tensor[static_cast<size_t>(index)];
    const Instance& t = target(o, from, copy);
    const int mapped = o.local < static_cast<int>(t.tensors.size()) ? t.tensors[static_cast<size_t>(o.local)] : -1;
    if (mapped < 0) throw NotRepeatable("tensor " + std::to_string(index) + " has no counterpart in deep block " + std::to_string(t.block));
    return mapped;
  }
  int kernel(int index, const Instance& from) {
    const Origin o = segments_.kernel[static_cast<size_t>(index)];
    const Instance& k = target(o, from);
    const int mapped = o.local < static_cast<int>(k.kernels.size()) ? k.kernels[static_cast<size_t>(o.local)] : -1;
    if (mapped < 0) throw NotRepeatable("kernel " + std::to_string(index) + " has no counterpart in deep block " + std::to_string(k.block));
    return mapped;
  }
  int bucket(int b, const Instance& from) const {
    auto place = bucket_place_.find(b);
    if (place == bucket_place_.end()) throw NotRepeatable("bucket " + std::to_string(b) + " is in no block");
    const int block = map_block(place->second.first, segments_.list[static_cast<size_t>(from.segment)].block, from.block);
    auto deep = r_.deep_buckets.find(block);
    if (deep == r_.deep_buckets.end() || place->second.second >= static_cast<int>(deep->second.size()))
      throw NotRepeatable("bucket " + std::to_string(b) + " has no counterpart in deep block " + std::to_string(block));
    return deep->second[static_cast<size_t>(place->second.second)];
  }

  bool made_by_repeated(int tensor) const {
    const Segment& x = segments_.list[static_cast<size_t>(segments_.tensor[static_cast<size_t>(tensor)].segment)];
    return x.pass != Pass::kOutside && x.block == r_.repeated();
  }

  void emit(int g, int block, StepTrace& out) {
    const Segment& s = segments_.list[static_cast<size_t>(g)];
    if (!instance_of_.emplace(std::make_pair(s.pass, block), instances_.size()).second)
      throw NotRepeatable("deep block " + std::to_string(block) + " written twice");
    instances_.push_back({g, block, std::vector<int>(static_cast<size_t>(s.tensors), -1),
                          std::vector<int>(static_cast<size_t>(s.kernels), -1)});
    const size_t self = instances_.size() - 1;
    int tensors = 0, kernels = 0;
    for (size_t i = s.begin; i < s.end; ++i) {
      const TraceEvent& e = in_.events[i];
      Instance& me = instances_[self];
      switch (e.kind) {
        case TraceEvent::Kind::kAllocated: {
          TraceTensor t = in_.tensors[static_cast<size_t>(e.index)];
          if (t.producer >= 0) t.producer = kernel(t.producer, me);
          const int index = static_cast<int>(out.tensors.size());
          out.tensors.push_back(t);
          me.tensors[static_cast<size_t>(tensors++)] = index;
          out.events.push_back({e.kind, index});
          break;
        }
        case TraceEvent::Kind::kFreed: {
          // A block that is not a layer freeing what the repeated layer made (the autocast
          // cache's copies, released in the order they were cast): the run once per copy.
          size_t run = i;
          while (!is_layer(s.block) && run < s.end && in_.events[run].kind == TraceEvent::Kind::kFreed &&
                 made_by_repeated(in_.events[run].index))
            ++run;
          if (run == i) {
            out.events.push_back({e.kind, tensor(e.index, me)});
            break;
          }
          for (int c = 0; c <= r_.added(); ++c)
            for (size_t q = i; q < run; ++q) out.events.push_back({e.kind, tensor(in_.events[q].index, me, c)});
          i = run - 1;
          break;
        }
        case TraceEvent::Kind::kKernelBegins: {
          TraceKernel k = in_.kernels[static_cast<size_t>(e.index)];
          k.block = map_block(k.block, s.block, block);
          for (int& input : k.inputs) input = tensor(input, me);
          for (int& b : k.gradient_buckets) b = bucket(b, me);
          const int index = static_cast<int>(out.kernels.size());
          out.kernels.push_back(std::move(k));
          me.kernels[static_cast<size_t>(kernels++)] = index;
          out.events.push_back({e.kind, index});
          break;
        }
        case TraceEvent::Kind::kKernelEnds:
          out.events.push_back({e.kind, kernel(e.index, me)});
          break;
      }
    }
  }

  const StepTrace& in_;
  const LayerRepeat& r_;
  Segments segments_;
  std::map<int, std::pair<int, int>> bucket_place_;  // shallow bucket -> (block, place in it)
  std::map<std::pair<Pass, int>, size_t> instance_of_;
  std::vector<Instance> instances_;
};

}  // namespace

StepTrace repeat_layers(const StepTrace& shallow, const LayerRepeat& repeat, std::string& why) {
  why.clear();
  if (repeat.layers < 3 || repeat.added() < 0) {
    why = "a trace of " + std::to_string(repeat.layers) + " layers does not stretch to " + std::to_string(repeat.target_layers);
    return {};
  }
  try {
    return Stretch(shallow, repeat).run();
  } catch (const NotRepeatable& e) {
    why = e.what();
    return {};
  }
}

namespace {

// Each deep bucket `b` of the shallow one becomes.
template <typename Each>
void deep_buckets_of(size_t b, const LayerRepeat& repeat, Each each) {
  for (const auto& [block, buckets] : repeat.shallow_buckets) {
    auto at = std::find(buckets.begin(), buckets.end(), static_cast<int>(b));
    if (at == buckets.end()) continue;
    const size_t rank = static_cast<size_t>(at - buckets.begin());
    const bool copied = block == repeat.repeated();
    const int first = block <= repeat.repeated() ? block : block + repeat.added();
    const int last = copied ? first + repeat.added() : first;
    for (int d = first; d <= last; ++d) {
      auto deep = repeat.deep_buckets.find(d);
      if (deep != repeat.deep_buckets.end() && rank < deep->second.size()) each(static_cast<size_t>(deep->second[rank]));
    }
  }
}

}  // namespace

std::vector<std::pair<size_t, int64_t>> repeat_bucket_elements(const std::vector<std::pair<size_t, int64_t>>& shallow,
                                                               const LayerRepeat& repeat) {
  std::map<size_t, int64_t> out;
  for (const auto& [b, n] : shallow) deep_buckets_of(b, repeat, [&](size_t d) { out[d] = n; });
  return {out.begin(), out.end()};
}

std::vector<size_t> repeat_buckets(const std::vector<size_t>& shallow, const LayerRepeat& repeat) {
  std::set<size_t> out;
  for (size_t b : shallow) deep_buckets_of(b, repeat, [&](size_t d) { out.insert(d); });
  return {out.begin(), out.end()};
}

int64_t live_peak_bytes(const StepTrace& trace) {
  int64_t live = 0, peak = 0;
  for (const TraceEvent& e : trace.events) {
    if (e.kind == TraceEvent::Kind::kAllocated) peak = std::max(peak, live += trace.tensors[static_cast<size_t>(e.index)].bytes);
    if (e.kind == TraceEvent::Kind::kFreed) live -= trace.tensors[static_cast<size_t>(e.index)].bytes;
  }
  return peak;
}

namespace {

bool same_kernel(const TraceKernel& a, const TraceKernel& b) {
  return std::strcmp(a.op, b.op) == 0 && a.flops == b.flops && a.bytes == b.bytes && a.type == b.type &&
         a.inputs == b.inputs && a.backward == b.backward && a.recomputable == b.recomputable && a.heavy == b.heavy &&
         a.attention_length == b.attention_length && a.misaligned == b.misaligned && a.converts == b.converts &&
         a.gradient_buckets == b.gradient_buckets && a.block == b.block && a.modeled_ms == b.modeled_ms;
}

// The events with each run of frees (tensors freed between the same two kernels) sorted by tensor:
// they happen at one point of the step, and their order changes no byte count. (The outputs of a
// non-recomputable op, context parallelism's attention, live as long as their records, which the
// step's end releases in an order that follows no layer.)
std::vector<TraceEvent> frees_in_order(std::vector<TraceEvent> events) {
  auto freed = [](const TraceEvent& e) { return e.kind == TraceEvent::Kind::kFreed; };
  for (auto run = events.begin(); run != events.end();) {
    if (!freed(*run)) {
      ++run;
      continue;
    }
    const auto end = std::find_if_not(run, events.end(), freed);
    std::sort(run, end, [](const TraceEvent& p, const TraceEvent& q) { return p.index < q.index; });
    run = end;
  }
  return events;
}

}  // namespace

bool same_step(const StepTrace& a, const StepTrace& b, std::string* difference) {
  auto differ = [&](const std::string& what) {
    if (difference != nullptr) *difference = what;
    return false;
  };
  if (a.persistent_bytes != b.persistent_bytes)
    return differ("persistent bytes " + std::to_string(a.persistent_bytes) + " vs " + std::to_string(b.persistent_bytes));
  if (a.tensors.size() != b.tensors.size() || a.kernels.size() != b.kernels.size() || a.events.size() != b.events.size())
    return differ(std::to_string(a.tensors.size()) + " tensors, " + std::to_string(a.kernels.size()) + " kernels, " +
                  std::to_string(a.events.size()) + " events vs " + std::to_string(b.tensors.size()) + ", " +
                  std::to_string(b.kernels.size()) + ", " + std::to_string(b.events.size()));
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const TraceTensor &x = a.tensors[i], &y = b.tensors[i];
    if (x.bytes != y.bytes || x.producer != y.producer || x.low_end != y.low_end) return differ("tensor " + std::to_string(i));
  }
  for (size_t i = 0; i < a.kernels.size(); ++i)
    if (!same_kernel(a.kernels[i], b.kernels[i])) return differ("kernel " + std::to_string(i) + " (" + a.kernels[i].op + ")");
  const std::vector<TraceEvent> x = frees_in_order(a.events), y = frees_in_order(b.events);
  for (size_t i = 0; i < x.size(); ++i)
    if (x[i].kind != y[i].kind || x[i].index != y[i].index) return differ("event " + std::to_string(i));
  return true;
}

}  // namespace ht

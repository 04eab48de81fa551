#include "alloc/cpu_arena.h"

#include <limits>

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <stdexcept>
#include <string>
#include <utility>

namespace ht {
namespace {

constexpr int64_t kAlign = static_cast<int64_t>(CpuArena::kAlignment);

int64_t round_up(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

}  // namespace

double ArenaStats::fragmentation() const {
  if (free_bytes <= 0) return 0.0;
  return 1.0 - static_cast<double>(largest_free_block) / static_cast<double>(free_bytes);
}

CpuArena::CpuArena(int64_t capacity_bytes) {
  if (capacity_bytes <= 0) {
    throw std::runtime_error("CpuArena: capacity must be positive, got " +
                             std::to_string(capacity_bytes) + " bytes");
  }
  if (capacity_bytes > INT64_MAX - kAlign) {
    throw std::runtime_error("CpuArena: capacity too large: " + std::to_string(capacity_bytes));
  }
  capacity_ = round_up(capacity_bytes);
  // MAP_NORESERVE: a large budget must not need that much swap up front; pages are committed
  // only when a tensor writes them.
  void* base = mmap(nullptr, static_cast<size_t>(capacity_), PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) {
    throw std::runtime_error("CpuArena: cannot reserve " + std::to_string(capacity_) +
                             " bytes: " + std::strerror(errno));
  }
  base_ = static_cast<char*>(base);
  add_free(0, capacity_);
}

CpuArena::CpuArena(void* base, int64_t capacity_bytes, std::function<void(void*)> release)
    : release_(std::move(release)) {
  if (base == nullptr || reinterpret_cast<uintptr_t>(base) % kAlignment != 0) {
    throw std::runtime_error("CpuArena: the range's base must be a non-null multiple of " +
                             std::to_string(kAlignment) + " bytes");
  }
  capacity_ = capacity_bytes / kAlign * kAlign;
  if (capacity_ <= 0) {
    throw std::runtime_error("CpuArena: capacity must be at least " + std::to_string(kAlign) + " bytes, got " +
                             std::to_string(capacity_bytes));
  }
  base_ = static_cast<char*>(base);
  add_free(0, capacity_);
}

CpuArena::~CpuArena() {
  if (!allocated_.empty()) {
    std::fprintf(stderr,
                 "warning: CpuArena destroyed with %zu blocks (%lld bytes) in use; "
                 "leaking its %lld-byte range\n",
                 allocated_.size(), static_cast<long long>(in_use_),
                 static_cast<long long>(capacity_));
    return;
  }
  if (release_) {
    release_(base_);
    return;
  }
  munmap(base_, static_cast<size_t>(capacity_));
}

void* CpuArena::allocate(size_t bytes, End end) {
  std::lock_guard<std::mutex> lock(mutex_);
  // Checked before rounding so a huge request cannot overflow into a small one.
  if (bytes > static_cast<size_t>(capacity_)) {
    ++failed_allocations_;
    return nullptr;
  }
  const int64_t size = rounded_size(bytes);
  int64_t offset = -1, hole = 0;
  if (end == End::kLow) {
    // The lowest free block that fits: what lives within a step packs from the bottom.
    for (auto it = free_by_offset_.begin(); it != free_by_offset_.end(); ++it) {
      if (it->second >= size) {
        offset = it->first;
        hole = it->second;
        break;
      }
    }
  } else if (end == End::kBestFit) {
    auto it = free_by_size_.lower_bound({size, std::numeric_limits<int64_t>::min()});
    if (it != free_by_size_.end()) {
      hole = it->first;
      offset = it->second;
    }
  } else {
    // The highest free block that fits: state that lives across steps stacks up from the top.
    for (auto it = free_by_offset_.rbegin(); it != free_by_offset_.rend(); ++it) {
      if (it->second >= size) {
        offset = it->first;
        hole = it->second;
        break;
      }
    }
  }
  if (offset < 0) {
    ++failed_allocations_;
    return nullptr;
  }
  if (following_) note_placement(end, offset, size);
  remove_free(free_by_offset_.find(offset));
  if (end != End::kHigh) {
    // The block keeps the hole's low end, so repeated allocations pack towards low addresses.
    if (hole > size) add_free(offset + size, hole - size);
    if (following_ && offset == growing_) growing_ = hole > size ? offset + size : -1;
  } else {
    if (hole > size) add_free(offset, hole - size);
    if (following_ && offset == growing_ && hole == size) growing_ = -1;
    offset += hole - size;
  }
  return take(offset, size);
}

void* CpuArena::allocate_at(int64_t offset, size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  // Each bound checked before it is added to, so no sum can overflow.
  if (offset < 0 || offset % kAlign != 0 || offset >= capacity_ ||
      bytes > static_cast<size_t>(capacity_ - offset)) {
    ++failed_allocations_;
    return nullptr;
  }
  const int64_t size = rounded_size(bytes);
  // The free block that could hold the range is the last one starting at or before it.
  auto hole = free_by_offset_.upper_bound(offset);
  if (hole == free_by_offset_.begin()) {
    ++failed_allocations_;
    return nullptr;
  }
  --hole;
  const int64_t hole_start = hole->first;
  const int64_t hole_end = hole->first + hole->second;
  if (offset + size > hole_end) {  // also when offset lies in an allocated block past the hole
    ++failed_allocations_;
    return nullptr;
  }
  if (following_ && hole_start == growing_) {  // a layout's own offsets: not followed
    placed_by_capacity_ = true;
    growing_ = -1;
  }
  remove_free(hole);
  if (offset > hole_start) add_free(hole_start, offset - hole_start);
  if (hole_end > offset + size) add_free(offset + size, hole_end - offset - size);
  return take(offset, size);
}

CpuArena::End CpuArena::end_for(size_t bytes, bool activation, bool recomputed) const {
  if (!activation || static_cast<int64_t>(bytes) < small_block_bytes(capacity())) return End::kHigh;
  return recomputed ? End::kBestFit : End::kLow;
}

int64_t CpuArena::small_block_bytes(int64_t capacity) { return std::min<int64_t>(int64_t{1} << 20, capacity / 256); }

int64_t CpuArena::rounded_size(size_t bytes) {
  return bytes == 0 ? kAlign : round_up(static_cast<int64_t>(bytes));
}

void* CpuArena::take(int64_t offset, int64_t size) {
  allocated_.emplace(offset, size);
  in_use_ += size;
  if (in_use_ > peak_in_use_) peak_in_use_ = in_use_;
  if (in_use_ > window_peak_) window_peak_ = in_use_;
  ++allocations_;
  return base_ + offset;
}

void CpuArena::deallocate(void* p) {
  if (p == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t offset = offset_of(p);
  const auto block = offset < 0 ? allocated_.end() : allocated_.find(offset);
  if (block == allocated_.end()) {
    throw std::logic_error("CpuArena::deallocate: pointer is not the start of an allocated block");
  }
  const int64_t block_size = block->second;
  allocated_.erase(block);
  in_use_ -= block_size;

  int64_t start = offset;
  int64_t size = block_size;
  bool growing = false;  // merged with the free block a larger capacity grows
  const auto next = free_by_offset_.lower_bound(offset);
  if (next != free_by_offset_.end() && next->first == offset + block_size) {
    growing = next->first == growing_;
    size += next->second;
    remove_free(next);
  }
  // Looked up again: `next` may have been erased above.
  const auto after = free_by_offset_.lower_bound(offset);
  if (after != free_by_offset_.begin()) {
    const auto prev = std::prev(after);
    if (prev->first + prev->second == offset) {
      growing = growing || prev->first == growing_;
      start = prev->first;
      size += prev->second;
      remove_free(prev);
    }
  }
  add_free(start, size);
  if (following_ && growing) growing_ = start;
}

bool CpuArena::contains(const void* p) const {
  const char* c = static_cast<const char*>(p);
  return c >= base_ && c < base_ + capacity_;
}

int64_t CpuArena::block_bytes(const void* p) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t offset = offset_of(p);
  const auto block = allocated_.find(offset);
  return block == allocated_.end() ? 0 : block->second;
}

int64_t CpuArena::adjacent_free_bytes(const void* p) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto block = allocated_.find(offset_of(p));
  if (block == allocated_.end()) return 0;
  const auto sides = free_neighbours(block->first, block->second);
  return sides.first + sides.second;
}

int64_t CpuArena::free_span_if_freed(const void* p) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto block = allocated_.find(offset_of(p));
  if (block == allocated_.end()) return 0;
  const auto sides = free_neighbours(block->first, block->second);
  return sides.first + block->second + sides.second;
}

int64_t CpuArena::offset_of_block(const void* p) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t offset = offset_of(p);
  return offset >= 0 && allocated_.count(offset) != 0 ? offset : -1;
}

std::vector<std::pair<int64_t, int64_t>> CpuArena::allocated_blocks() const {
  std::vector<std::pair<int64_t, int64_t>> blocks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    blocks.assign(allocated_.begin(), allocated_.end());
  }
  std::sort(blocks.begin(), blocks.end());
  return blocks;
}

void CpuArena::note_placement(End end, int64_t offset, int64_t size) {
  if (placed_by_capacity_) return;
  if (growing_ < 0) {  // used up: a larger arena has a free block here that this one has not
    placed_by_capacity_ = true;
    return;
  }
  const int64_t grown = free_by_offset_.at(growing_);
  if (end == End::kLow) {
    placed_by_capacity_ = growing_ < offset;  // passed over: too small here, larger elsewhere
  } else if (end == End::kHigh) {
    placed_by_capacity_ = growing_ > offset;
  } else if (offset != growing_) {
    placed_by_capacity_ = grown < size;  // a larger one might fit, and be the smallest
  } else {
    // The smallest that fits; larger, another of its size or above could be.
    auto it = free_by_size_.find({grown, growing_});
    placed_by_capacity_ = std::next(it) != free_by_size_.end();
  }
}

void CpuArena::follow_capacity() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (allocations_ > 0) throw std::logic_error("CpuArena::follow_capacity: call it before the first allocation");
  following_ = true;
}

bool CpuArena::placed_by_capacity() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return placed_by_capacity_;
}

ArenaStats CpuArena::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  ArenaStats s;
  s.capacity = capacity_;
  s.in_use = in_use_;
  s.peak_in_use = peak_in_use_;
  s.free_bytes = capacity_ - in_use_;
  s.largest_free_block = free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
  s.blocks_in_use = static_cast<int64_t>(allocated_.size());
  s.free_blocks = static_cast<int64_t>(free_by_offset_.size());
  s.allocations = allocations_;
  s.failed_allocations = failed_allocations_;
  return s;
}

void CpuArena::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  peak_in_use_ = in_use_;
}

void CpuArena::begin_peak_window() {
  std::lock_guard<std::mutex> lock(mutex_);
  window_peak_ = in_use_;
}

int64_t CpuArena::window_peak() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return window_peak_;
}

int64_t CpuArena::capacity() const { return capacity_; }

int64_t CpuArena::offset_of(const void* p) const {
  if (p == nullptr || !contains(p)) return -1;
  return static_cast<const char*>(p) - base_;
}

void CpuArena::add_free(int64_t offset, int64_t size) {
  free_by_offset_.emplace(offset, size);
  free_by_size_.emplace(size, offset);
}

void CpuArena::remove_free(std::map<int64_t, int64_t>::iterator it) {
  free_by_size_.erase({it->second, it->first});
  free_by_offset_.erase(it);
}

std::pair<int64_t, int64_t> CpuArena::free_neighbours(int64_t offset, int64_t size) const {
  int64_t before = 0;
  int64_t after = 0;
  const auto next = free_by_offset_.lower_bound(offset);
  if (next != free_by_offset_.begin()) {
    const auto prev = std::prev(next);
    if (prev->first + prev->second == offset) before = prev->second;
  }
  if (next != free_by_offset_.end() && next->first == offset + size) after = next->second;
  return {before, after};
}

}  // namespace ht

#pragma once
// A fixed-capacity region from which "device" tensors are carved, so that a memory budget
// behaves like a device's: a request can fail, and freed memory can be too scattered to serve
// one. The bookkeeping lives on the ordinary heap, never in the region, which holds tensor data
// only: so the same arena serves a CPU rank (an mmap'd range) and a GPU (one cudaMalloc block,
// alloc/cuda_arena.h). Pure C++: the ATen allocators that wrap it live elsewhere.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ht {

struct ArenaStats {
  int64_t capacity = 0;            // bytes reserved
  int64_t in_use = 0;              // bytes in allocated blocks (rounded sizes)
  int64_t peak_in_use = 0;         // since construction or reset_peak()
  int64_t free_bytes = 0;          // capacity - in_use
  int64_t largest_free_block = 0;
  int64_t blocks_in_use = 0;
  int64_t free_blocks = 0;
  int64_t allocations = 0;         // successful allocate() calls
  int64_t failed_allocations = 0;  // allocate() calls that returned nullptr
  // 1 - largest_free_block / free_bytes (0 when nothing is free): how much of the free memory
  // cannot serve one request.
  double fragmentation() const;
};

// Best-fit allocator over one mmap'd range. Thread-safe: ATen worker threads may allocate and
// free concurrently, so one mutex guards the bookkeeping; every operation is O(log n).
class CpuArena {
 public:
  // What c10's CPU allocator guarantees, so vectorised kernels see the alignment they expect.
  static constexpr size_t kAlignment = 64;

  // Capacity is rounded up to kAlignment. Pages are reserved, not committed, so untouched
  // capacity costs nothing. Throws std::runtime_error if capacity <= 0 or mmap fails.
  explicit CpuArena(int64_t capacity_bytes);
  // Over a range the caller owns (a cudaMalloc block): `base` aligned to kAlignment, capacity
  // rounded down to it. The arena never reads or writes the range; `release` gives it back when
  // the arena is destroyed with no block in use. Throws std::runtime_error on a bad range.
  CpuArena(void* base, int64_t capacity_bytes, std::function<void(void*)> release);
  // Leaks the mapping (with a warning) while blocks are in use: tensors may still point in.
  ~CpuArena();
  CpuArena(const CpuArena&) = delete;
  CpuArena& operator=(const CpuArena&) = delete;

  // Which end of the arena a block comes from. Keeping what lives across training steps
  // (parameters, their gradients, optimizer state) apart from what lives within one
  // (activations) keeps either from cutting the other's free memory into pieces.
  enum class End { kLow, kHigh, kBestFit };
  // kLow: the lowest free block that fits, carved from its low end; kHigh: the highest, carved
  // from its high end; kBestFit: the smallest (the lowest of equals), carved from its low end.
  // (Best fit for every block left no more room for DTR than first fit from each end; for
  // regenerated blocks alone it does: end_for.) Returns nullptr, never throws, when nothing
  // fits. A zero-byte request takes kAlignment bytes so the pointer is unique.
  void* allocate(size_t bytes, End end = End::kLow);
  // Carves exactly [offset, offset + rounded size) out of the free block that holds it, for a
  // static layout planned offline (alloc/static_layout.h), whose offsets must be honoured to
  // the byte. Returns nullptr, never throws, when offset is not a multiple of kAlignment, the
  // range leaves the arena or any of it is in use; counts like allocate() (a refusal is a
  // failed allocation). Offsets are bytes from the arena's base.
  void* allocate_at(int64_t offset, size_t bytes);
  // The size a request of `bytes` takes: rounded up to kAlignment, kAlignment for zero.
  // `bytes` must not exceed capacity() (larger requests fail before rounding).
  static int64_t rounded_size(size_t bytes);
  // Where a block goes: an activation's (a forward kernel's) at the low end, unless it is small;
  // everything else at the high end. Small blocks go with the rest even from a forward kernel:
  // left among activations, a few bytes that outlive their neighbours split two holes that could
  // have made one (PyTorch's caching allocator keeps a small pool apart for the same reason).
  // The allocator (cpu_device_allocator.cpp) and the planner's replay both place by this rule.
  // A regenerated activation (`recomputed`) takes the smallest free block that fits (kBestFit):
  // it closes a hole rather than cutting into the largest free range a later request may need.
  End end_for(size_t bytes, bool activation, bool recomputed = false) const;
  // Below this size a block is small (end_for) in an arena of `capacity` bytes: 1 MiB, or a 256th
  // of a smaller arena.
  static int64_t small_block_bytes(int64_t capacity);
  // Merges the block with its free neighbours. Throws std::logic_error unless p starts an
  // allocated block; nullptr is a no-op.
  void deallocate(void* p);

  // Lock-free: compares against the reserved range only.
  bool contains(const void* p) const;
  // Rounded size of the allocated block starting at p; 0 if p starts no allocated block.
  int64_t block_bytes(const void* p) const;
  // Bytes of the free blocks immediately before and after the allocated block at p (0 if none
  // or not a block): what evicting it would add to a contiguous hole beyond its own size.
  int64_t adjacent_free_bytes(const void* p) const;
  // Previous free neighbour + block + next free neighbour: the hole freeing p would create.
  int64_t free_span_if_freed(const void* p) const;
  // Offset from the base of the allocated block starting at p; -1 if p starts no allocated block.
  int64_t offset_of_block(const void* p) const;
  // Every allocated block as (offset, rounded size), by offset: what a layout must go around.
  std::vector<std::pair<int64_t, int64_t>> allocated_blocks() const;

  // Whether some block went where it went because of the arena's capacity: in a larger arena,
  // the same requests and frees could have placed it elsewhere. The free block a larger capacity
  // would make larger (at first the whole arena) is followed; a request that passed over it for
  // want of room, took it where another free block also fit (best fit), or used it up says so.
  // While false, the same sequence in any larger arena (of the same small_block_bytes) places
  // every block at the same offset from the end it came from, and fails nowhere it did not.
  // Only while followed: call follow_capacity() before the first allocation (the planner's
  // replay does; the engine's allocator does not pay for it). Throws std::logic_error after one.
  bool placed_by_capacity() const;
  void follow_capacity();

  ArenaStats stats() const;
  void reset_peak();  // peak_in_use = in_use
  // A second peak, for one kernel's working memory (memory/step_capture.h), that leaves the
  // step's peak alone: window_peak() is the highest in_use since begin_peak_window().
  void begin_peak_window();
  int64_t window_peak() const;
  int64_t capacity() const;

 private:
  // Offsets, not pointers, so the bookkeeping never depends on where the mapping landed.
  int64_t offset_of(const void* p) const;
  void add_free(int64_t offset, int64_t size);
  void remove_free(std::map<int64_t, int64_t>::iterator it);
  // Books [offset, offset + size), already taken out of the free maps; caller holds the lock.
  void* take(int64_t offset, int64_t size);
  // Before a block of `size` is carved from the free block at `offset`: whether its place
  // depended on the capacity (placed_by_capacity); caller holds the lock.
  void note_placement(End end, int64_t offset, int64_t size);
  // Sizes of the free blocks adjacent to [offset, offset + size); caller holds the lock.
  std::pair<int64_t, int64_t> free_neighbours(int64_t offset, int64_t size) const;

  char* base_ = nullptr;
  int64_t capacity_ = 0;
  std::function<void(void*)> release_;  // set: the caller's range; unset: our mapping

  mutable std::mutex mutex_;
  std::map<int64_t, int64_t> free_by_offset_;            // offset -> size, for coalescing
  std::set<std::pair<int64_t, int64_t>> free_by_size_;   // (size, offset), for best fit
  std::unordered_map<int64_t, int64_t> allocated_;       // offset -> rounded size
  int64_t in_use_ = 0;
  int64_t peak_in_use_ = 0;
  int64_t window_peak_ = 0;
  int64_t allocations_ = 0;
  int64_t failed_allocations_ = 0;
  bool following_ = false;           // follow_capacity() was called
  int64_t growing_ = 0;              // offset of the free block a larger capacity grows; -1: none
  bool placed_by_capacity_ = false;
};

}  // namespace ht

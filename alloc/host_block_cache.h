#pragma once
// Keeps freed CPU memory in the process instead of returning it to the system, as every GPU
// framework's caching allocator does with device memory. A training step allocates and frees
// the same sizes every iteration; glibc's malloc returns large blocks (mmap'd above its
// threshold, or trimmed from the heap's top) and faults their pages back in on the next step,
// which measured a third of a CPU step's time in the kernel. Here a freed block goes on a free
// list of its exact size and the next request of that size takes it back, pages already mapped.
//
// Sizes are rounded up to 512 bytes, so a step's shapes map to few lists and nothing is wasted
// beyond the rounding. What is cached is bounded: when a request misses and the free blocks
// exceed max(limit, bytes in use), they are all returned first (the workload changed shape:
// evaluation's last partial batch, a new sequence length). Thread-safe: ATen's workers allocate.
// It changes where data lives, never what a kernel computes: results are bit-identical.

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace ht {

struct HostCacheStats {
  int64_t in_use = 0;       // bytes of blocks handed out (rounded sizes)
  int64_t cached = 0;       // bytes of free blocks kept for reuse
  int64_t hits = 0, misses = 0;
  int64_t trims = 0;        // times the free blocks were returned to the system
};

class HostBlockCache {
 public:
  static constexpr size_t kAlignment = 64;    // what c10's CPU allocator guarantees
  static constexpr size_t kGranule = 512;     // sizes are rounded up to this
  // Free blocks above max(free_limit, in use) are returned at the next miss.
  explicit HostBlockCache(int64_t free_limit = int64_t{64} << 20) : free_limit_(free_limit) {}
  ~HostBlockCache();
  HostBlockCache(const HostBlockCache&) = delete;
  HostBlockCache& operator=(const HostBlockCache&) = delete;

  static size_t rounded(size_t bytes) { return (bytes + kGranule - 1) / kGranule * kGranule; }
  // A block of at least `bytes`, aligned to kAlignment; `capacity` must be passed back to release.
  // Throws std::bad_alloc when the system has no memory even after the cache is emptied.
  void* allocate(size_t bytes, size_t& capacity);
  // Keeps the block for reuse, or with keep = false returns it to the system.
  void release(void* data, size_t capacity, bool keep = true);
  // Returns every free block to the system.
  void trim();
  HostCacheStats stats() const;

 private:
  void trim_locked();

  mutable std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;  // capacity -> free blocks
  HostCacheStats stats_;
  int64_t free_limit_;
};

}  // namespace ht

#include "alloc/host_block_cache.h"

#include "alloc/cpu_device_allocator.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <thread>
#include <vector>

namespace ht {
namespace {

TEST(HostBlockCache, AFreedBlockServesTheNextRequestOfItsSize) {
  HostBlockCache cache;
  size_t capacity = 0;
  void* a = cache.allocate(1000, capacity);
  EXPECT_EQ(capacity, HostBlockCache::rounded(1000));
  EXPECT_EQ(capacity % HostBlockCache::kGranule, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % HostBlockCache::kAlignment, 0u);
  cache.release(a, capacity);
  EXPECT_EQ(cache.stats().cached, static_cast<int64_t>(capacity));
  size_t again = 0;
  void* b = cache.allocate(900, again);  // rounds to the same size: the same block
  EXPECT_EQ(b, a);
  EXPECT_EQ(cache.stats().hits, 1);
  EXPECT_EQ(cache.stats().cached, 0);
  EXPECT_EQ(cache.stats().in_use, static_cast<int64_t>(capacity));
  size_t other = 0;
  void* c = cache.allocate(5000, other);  // another size: a new block
  EXPECT_NE(c, a);
  EXPECT_EQ(cache.stats().misses, 2);
  cache.release(b, again);
  cache.release(c, other);
  EXPECT_EQ(cache.stats().in_use, 0);
}

TEST(HostBlockCache, AMissReturnsTheFreeBlocksOnceTheyExceedTheLimit) {
  HostBlockCache cache(/*free_limit=*/1 << 20);
  size_t cap_a = 0, cap_b = 0, cap_c = 0;
  void* a = cache.allocate(3 << 20, cap_a);
  cache.release(a, cap_a);  // 3 MiB free, nothing in use: over the limit
  void* b = cache.allocate(512 << 10, cap_b);  // a miss: the free blocks go first
  EXPECT_EQ(cache.stats().trims, 1);
  EXPECT_EQ(cache.stats().cached, 0);
  cache.release(b, cap_b);  // 512 KiB free: under the limit, kept
  void* c = cache.allocate(2048, cap_c);
  EXPECT_EQ(cache.stats().trims, 1);
  EXPECT_EQ(cache.stats().cached, static_cast<int64_t>(cap_b));
  cache.release(c, cap_c, /*keep=*/false);  // returned, not kept
  EXPECT_EQ(cache.stats().cached, static_cast<int64_t>(cap_b));
  cache.trim();
  EXPECT_EQ(cache.stats().cached, 0);
  EXPECT_EQ(cache.stats().in_use, 0);
}

TEST(HostBlockCache, ThreadsShareItSafely) {
  HostBlockCache cache;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&cache, t] {
      for (int i = 0; i < 2000; ++i) {
        size_t capacity = 0;
        void* p = cache.allocate(static_cast<size_t>(512 * (1 + (i + t) % 7)), capacity);
        static_cast<char*>(p)[0] = 1;
        cache.release(p, capacity);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const HostCacheStats s = cache.stats();
  EXPECT_EQ(s.in_use, 0);
  EXPECT_EQ(s.hits + s.misses, 8000);
  EXPECT_GT(s.hits, 0);
}

// Through ATen's allocator: a tensor freed and asked for again gets the same memory back, the
// counter still counts the tensor's bytes, and turning caching off returns what is kept.
TEST(HostMemoryCaching, AtenTensorsReuseFreedBlocksWhileOn) {
  CpuAllocationCounter& counter = CpuAllocationCounter::install();
  const bool was = host_memory_caching();
  set_host_memory_caching(true);
  const int64_t base = counter.current_bytes();
  const void* first = nullptr;
  {
    at::Tensor a = at::empty({12345}, at::kFloat);
    first = a.data_ptr();
    EXPECT_EQ(counter.current_bytes() - base, 12345 * 4);
  }
  EXPECT_EQ(counter.current_bytes(), base);
  EXPECT_GT(host_memory_cache_stats().cached, 0);
  {
    at::Tensor b = at::empty({12345}, at::kFloat);
    EXPECT_EQ(b.data_ptr(), first);
    set_host_memory_caching(false);  // b, from the cache, goes back to the system when freed
  }
  EXPECT_EQ(host_memory_cache_stats().cached, 0);
  EXPECT_EQ(counter.current_bytes(), base);
  set_host_memory_caching(was);
}

}  // namespace
}  // namespace ht

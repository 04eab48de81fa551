#include "alloc/host_block_cache.h"

#include <algorithm>
#include <cstdlib>
#include <new>

namespace ht {

HostBlockCache::~HostBlockCache() { trim(); }

void* HostBlockCache::allocate(size_t bytes, size_t& capacity) {
  capacity = rounded(bytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(capacity);
    if (it != free_.end() && !it->second.empty()) {
      void* data = it->second.back();
      it->second.pop_back();
      stats_.cached -= static_cast<int64_t>(capacity);
      stats_.in_use += static_cast<int64_t>(capacity);
      ++stats_.hits;
      return data;
    }
    ++stats_.misses;
    if (stats_.cached > std::max(free_limit_, stats_.in_use)) trim_locked();
    stats_.in_use += static_cast<int64_t>(capacity);
  }
  void* data = nullptr;
  if (posix_memalign(&data, kAlignment, capacity) != 0) {
    std::lock_guard<std::mutex> lock(mu_);
    trim_locked();  // what the cache holds may be what the system lacks
    if (posix_memalign(&data, kAlignment, capacity) != 0) {
      stats_.in_use -= static_cast<int64_t>(capacity);
      throw std::bad_alloc();
    }
  }
  return data;
}

void HostBlockCache::release(void* data, size_t capacity, bool keep) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.in_use -= static_cast<int64_t>(capacity);
    if (keep) {
      free_[capacity].push_back(data);
      stats_.cached += static_cast<int64_t>(capacity);
      return;
    }
  }
  std::free(data);
}

void HostBlockCache::trim() {
  std::lock_guard<std::mutex> lock(mu_);
  trim_locked();
}

void HostBlockCache::trim_locked() {
  if (stats_.cached == 0) return;
  for (auto& [capacity, blocks] : free_) {
    for (void* data : blocks) std::free(data);
  }
  free_.clear();
  stats_.cached = 0;
  ++stats_.trims;
}

HostCacheStats HostBlockCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace ht

#include "memory/memory_manager.h"

#include "runtime/tensor_info.h"

#include <algorithm>
#include <vector>

namespace ht {

void MemoryManager::before_kernel(const ComputePath& /*path*/, bool /*recompute*/) {
  // No budget yet: nothing to make room for.
}

void MemoryManager::after_kernel(const ComputePath& /*path*/, bool recompute, double kernel_ms) {
  ++stats_.kernels;
  if (recompute) {
    ++stats_.recomputations;
    stats_.recompute_ms += kernel_ms;
  }
}

void MemoryManager::on_resident(TensorInfo& t) {
  resident_.insert(&t);
  ++stats_.resident_tensors;
  stats_.resident_bytes += t.nbytes;
  stats_.peak_resident_bytes = std::max(stats_.peak_resident_bytes, stats_.resident_bytes);
}

void MemoryManager::on_dropped(TensorInfo& t) {
  if (resident_.erase(&t) == 0) return;
  --stats_.resident_tensors;
  stats_.resident_bytes -= t.nbytes;
}

void MemoryManager::on_destroyed(TensorInfo& t) { on_dropped(t); }

int64_t MemoryManager::evict_all() {
  const std::vector<TensorInfo*> candidates(resident_.begin(), resident_.end());
  int64_t evicted = 0;
  for (TensorInfo* t : candidates) {
    // Evicting a root drops its views too, so re-check residency.
    if (resident_.count(t) != 0 && t->evictable()) {
      remat_.evict(*t);
      ++evicted;
    }
  }
  stats_.evictions += evicted;
  return evicted;
}

}  // namespace ht

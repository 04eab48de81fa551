#pragma once
// The per-rank memory manager. In this version it keeps exact accounting of the interpreter's
// non-leaf tensors (what is resident, how many bytes, the peak, regenerations); budgets and
// eviction policies plug in here (DESIGN.md, "The memory manager").

#include "memory/memory_hooks.h"

#include <cstdint>
#include <unordered_set>

namespace ht {

struct MemoryStats {
  int64_t resident_bytes = 0;       // bytes of resident non-leaf storage now
  int64_t peak_resident_bytes = 0;  // since the last reset_peak()
  int64_t resident_tensors = 0;
  int64_t kernels = 0;              // kernels run, recomputations included
  int64_t recomputations = 0;       // kernels run to regenerate dropped data
  int64_t evictions = 0;
  double recompute_ms = 0;          // time spent in those kernels
};

class MemoryManager : public MemoryHooks {
 public:
  explicit MemoryManager(Rematerializer& remat) : remat_(remat) {}

  void before_kernel(const ComputePath& path, bool recompute) override;
  void after_kernel(const ComputePath& path, bool recompute, double kernel_ms) override;
  void on_resident(TensorInfo& t) override;
  void on_dropped(TensorInfo& t) override;
  void on_destroyed(TensorInfo& t) override;

  const MemoryStats& stats() const { return stats_; }
  void reset_peak() { stats_.peak_resident_bytes = stats_.resident_bytes; }
  // Resident non-leaf tensors, roots and views: the candidates a policy chooses from.
  const std::unordered_set<TensorInfo*>& resident() const { return resident_; }
  // Drop the data of every evictable resident tensor (tests use it to exercise regeneration).
  int64_t evict_all();

 private:
  Rematerializer& remat_;
  MemoryStats stats_;
  std::unordered_set<TensorInfo*> resident_;
};

}  // namespace ht

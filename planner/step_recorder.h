#pragma once
// Records one profiled micro-batch (forward and backward) into a StepTrace: every allocation and
// free in the arena (as the AllocationObserver), every kernel with the blocks it reads (as the
// memory manager's KernelObserver). Install it on the arena and the interpreter's memory manager
// for the micro-batch to record, then take() the trace. Recording runs without eviction: the
// trace is what the step needs, the replay decides what a budget would drop.

#include "alloc/cpu_device_allocator.h"
#include "memory/kernel_observer.h"
#include "planner/step_trace.h"
#include "runtime/kernel_cost.h"
#include "runtime/op.h"

#include <chrono>
#include <mutex>
#include <unordered_map>

namespace c10 {
class TensorImpl;
}

namespace ht {

class MemoryManager;
struct TensorInfo;

// A traced kernel's work (type, flops, bytes and how a device runs it) from its op's forward
// work: a forward's as measured on the tensors, a backward's by its op's gradient rule.
void set_kernel_work(TraceKernel& k, const OpTraits& traits, const KernelWork& forward, bool backward);

class StepRecorder final : public AllocationObserver, public KernelObserver {
 public:
  // Observes `memory`'s kernels and the active arena's allocations until destroyed.
  // `persistent_bytes`: the arena's bytes in use now, which the step does not free.
  StepRecorder(MemoryManager& memory, int64_t persistent_bytes);
  ~StepRecorder() override;
  StepRecorder(const StepRecorder&) = delete;
  StepRecorder& operator=(const StepRecorder&) = delete;

  void on_allocated(const void* data, int64_t bytes) override;
  void on_freed(const void* data, int64_t bytes) override;
  void kernel_begins(const ComputePath& path, bool recompute, bool backward) override;
  void kernel_ends(const ComputePath& path, bool recompute, bool backward) override;

  // Kernels from now on belong to model block `block` (-1: outside the blocks).
  void enter_block(int block);
  // Each parameter's bucket: backward kernels record the buckets whose gradients they make.
  void set_gradient_buckets(std::unordered_map<const c10::TensorImpl*, size_t> bucket_of) {
    gradient_bucket_of_ = std::move(bucket_of);
  }
  // The trace so far; recording stops.
  StepTrace take();

 private:
  int tensor_of(const TensorInfo& t) const;  // -1: not allocated during the step
  void add_input(std::vector<int>& inputs, const TensorInfo& t) const;

  MemoryManager& memory_;
  std::mutex mutex_;  // ATen's workers allocate too
  bool recording_ = true;
  StepTrace trace_;
  std::unordered_map<const void*, int> live_;  // data pointer -> tensor index
  std::vector<char> alive_;                    // by tensor index: not freed yet
  size_t first_tensor_of_kernel_ = 0;
  std::unordered_map<const ComputePath*, int> block_of_;  // forward op call -> its block
  int block_ = -1;
  std::unordered_map<const c10::TensorImpl*, size_t> gradient_bucket_of_;
  int kernel_ = -1;                            // the kernel running, or -1
  bool forward_kernel_ = false;
  std::chrono::steady_clock::time_point kernel_start_;
};

}  // namespace ht

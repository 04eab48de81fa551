#pragma once
// Which device a step traced on meta tensors (launcher/planning/meta_trace.h) stands for, where an
// op's kernel differs by device: layer norm's bf16 path (a GPU's kernel takes bf16 copies of the
// weights; a CPU's widens x to fp32). (Attention's blocks differ too, but a trace keeps the CPU's:
// runtime/ops/attention.cpp says why.) Meta tensors have no such device of their own, so a trace
// for a GPU opens a `TracedForGpu` scope on its thread, and the ops ask `runs_as_gpu`. Without one
// a meta tensor runs as the CPU's.

#include <c10/core/Device.h>

namespace ht {

class TracedForGpu {
 public:
  explicit TracedForGpu(bool gpu);
  ~TracedForGpu();
  TracedForGpu(const TracedForGpu&) = delete;
  TracedForGpu& operator=(const TracedForGpu&) = delete;
  static bool current();

 private:
  bool previous_;
};

// A tensor on `device` takes the GPU's kernel: a CUDA tensor, or a meta one traced for a GPU.
inline bool runs_as_gpu(const c10::Device& device) {
  return device.is_cuda() || (device.is_meta() && TracedForGpu::current());
}

}  // namespace ht

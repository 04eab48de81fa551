#pragma once
// Told, during one backward(), when each parameter's gradient is final: no tape entry left can
// add to it. Data parallelism listens to start a bucket's all-reduce while backward still runs
// (parallel/data_parallel.h). The tape calls it from the thread running backward().

#include <ATen/core/Tensor.h>

#include <vector>

namespace ht {

class GradientListener {
 public:
  virtual ~GradientListener() = default;
  // Before the first tape entry runs: the leaves (by TensorImpl) that some entry of this backward
  // may add a gradient to. Every other leaf's gradient is already final.
  virtual void backward_begins(const std::vector<const c10::TensorImpl*>& pending) = 0;
  // The last entry that could add to `param`'s gradient has run.
  virtual void gradient_ready(const at::Tensor& param) = 0;
};

}  // namespace ht

#pragma once
// The fused optimizers' CUDA parameters (training/fused_optimizer.h), stepped by ATen's
// multi-tensor kernels where this libtorch has them (>= 2.4): AdamW's (at::_fused_adamw_) and
// SGD's (at::_fused_sgd_), what torch.optim's `fused=True` runs: one launch for many tensors,
// each element's gradient, state and weight read once and written once. A batch holds one (step
// count or first step, type, device)'s parameters, launched after the group's others. Their
// arithmetic is not torch::optim's sequence: within rounding of it, the same bits run to run.

#include "training/fused_optimizer.h"

#include <ATen/core/Tensor.h>

#include <vector>

namespace ht {

// AdamW: the parameter, its gradient and its two moments dense and contiguous on one GPU, all four
// in one floating type; an fp32 parameter's bf16 gradient (training.gradient_dtype = "bf16") is
// widened for the kernel.
bool adamw_cuda_fusable(const at::Tensor& p, const at::Tensor& grad, const at::Tensor& m, const at::Tensor& v);

class AdamWCudaBatch {
 public:
  void add(const at::Tensor& p, const at::Tensor& grad, torch::optim::AdamWParamState& state);
  // Steps them: in one call, or where gradients are bf16, in calls of about 64 MiB of widened
  // ones (a model's gradients are never widened whole; not in the planner's temporaries yet).
  void launch(int64_t step, const torch::optim::AdamWOptions& o, const GradientScale& scale) const;

 private:
  std::vector<at::Tensor> params_, grads_, exp_avgs_, exp_avg_sqs_;
  bool narrow_gradients_ = false;
};

// SGD: the parameter, its gradient and (with momentum) its buffer dense and contiguous on one GPU
// in one floating type.
bool sgd_cuda_fusable(const at::Tensor& p, const at::Tensor& grad, const at::Tensor& buffer);

class SgdCudaBatch {
 public:
  // `buffer`: the momentum buffer (undefined without momentum); on a first step, made empty.
  void add(const at::Tensor& p, const at::Tensor& grad, const at::Tensor& buffer);
  // `first_step`: the buffers are set to the gradients (torch::optim's first step), not updated.
  void launch(const torch::optim::SGDOptions& o, bool first_step, const GradientScale& scale) const;

 private:
  std::vector<at::Tensor> params_, grads_, buffers_;
};

}  // namespace ht

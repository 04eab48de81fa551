#include "training/fused_optimizer_cuda.h"

#include "base/compat.h"

#include <cstddef>
#include <tuple>

namespace ht {
namespace {

// Widened bf16 gradients an AdamW launch holds at once.
constexpr int64_t kWidenedBytes = int64_t{64} << 20;

bool dense_beside(const at::Tensor& x, const at::Tensor& p) {
  return !x.is_sparse() && x.device() == p.device() && x.is_contiguous() && x.numel() == p.numel();
}

bool floating_16_or_32(at::ScalarType t) { return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf; }

}  // namespace

bool adamw_cuda_fusable(const at::Tensor& p, const at::Tensor& grad, const at::Tensor& m, const at::Tensor& v) {
  if (!compat::kFusedAdamWOnCuda || !p.is_cuda()) return false;
  const at::ScalarType t = p.scalar_type();
  if (!floating_16_or_32(t)) return false;
  for (const at::Tensor* x : {&p, &grad, &m, &v}) {
    const bool widened = x == &grad && t == at::kFloat && x->scalar_type() == at::kBFloat16;
    if ((x->scalar_type() != t && !widened) || !dense_beside(*x, p)) return false;
  }
  return true;
}

void AdamWCudaBatch::add(const at::Tensor& p, const at::Tensor& grad, torch::optim::AdamWParamState& state) {
  params_.push_back(p);
  grads_.push_back(grad);
  exp_avgs_.push_back(state.exp_avg());
  exp_avg_sqs_.push_back(state.exp_avg_sq());
  narrow_gradients_ = narrow_gradients_ || grad.scalar_type() != p.scalar_type();
}

void AdamWCudaBatch::launch(int64_t step, const torch::optim::AdamWOptions& o, const GradientScale& scale) const {
  const auto run = [&](const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                       const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs) {
    const bool ran = compat::fused_adamw_cuda(params, grads, exp_avgs, exp_avg_sqs, step, o.lr(), std::get<0>(o.betas()),
                                              std::get<1>(o.betas()), o.weight_decay(), o.eps(), scale.value,
                                              scale.on_device);
    TORCH_INTERNAL_ASSERT(ran, "a CUDA batch without ATen's fused AdamW");
  };
  if (!narrow_gradients_) return run(params_, grads_, exp_avgs_, exp_avg_sqs_);
  size_t first = 0;
  while (first < params_.size()) {
    std::vector<at::Tensor> wide;
    int64_t bytes = 0;
    size_t end = first;
    for (; end < params_.size() && (end == first || bytes + 4 * params_[end].numel() <= kWidenedBytes); ++end) {
      wide.push_back(grads_[end].to(params_[end].scalar_type()));
      bytes += 4 * params_[end].numel();
    }
    const auto part = [&](const std::vector<at::Tensor>& all) {
      return std::vector<at::Tensor>(all.begin() + static_cast<std::ptrdiff_t>(first),
                                     all.begin() + static_cast<std::ptrdiff_t>(end));
    };
    run(part(params_), wide, part(exp_avgs_), part(exp_avg_sqs_));
    first = end;
  }
}

bool sgd_cuda_fusable(const at::Tensor& p, const at::Tensor& grad, const at::Tensor& buffer) {
  if (!compat::kFusedSgdOnCuda || !p.is_cuda() || !floating_16_or_32(p.scalar_type())) return false;
  if (grad.scalar_type() != p.scalar_type() || !dense_beside(grad, p) || !dense_beside(p, p)) return false;
  return !buffer.defined() || (buffer.scalar_type() == p.scalar_type() && dense_beside(buffer, p));
}

void SgdCudaBatch::add(const at::Tensor& p, const at::Tensor& grad, const at::Tensor& buffer) {
  params_.push_back(p);
  grads_.push_back(grad);
  if (buffer.defined()) buffers_.push_back(buffer);
}

void SgdCudaBatch::launch(const torch::optim::SGDOptions& o, bool first_step, const GradientScale& scale) const {
  const bool ran = compat::fused_sgd_cuda(params_, grads_, buffers_, o.weight_decay(), o.momentum(), o.lr(),
                                          o.dampening(), o.nesterov(), first_step, scale.value, scale.on_device);
  TORCH_INTERNAL_ASSERT(ran, "a CUDA batch without ATen's fused SGD");
}

}  // namespace ht

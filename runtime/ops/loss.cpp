// Softmax, log-softmax and the negative log-likelihood loss.
#include "runtime/ops/op_util.h"

#include <ATen/core/Reduction.h>

namespace ht {
namespace {

using TensorList = std::vector<at::Tensor>;

class SoftmaxOp final : public Op {
 public:
  SoftmaxOp(int64_t dim, bool log)
      : Op(OpTraits::named(log ? "log_softmax" : "softmax").saving_outputs({0}).in_float32()), dim_(dim),
        log_(log) {}

  TensorList forward(const TensorList& in, const ForwardContext&) const override {
    return {log_ ? at::_log_softmax(in[0], dim_, false) : at::_softmax(in[0], dim_, false)};
  }
  TensorList backward(const BackwardArgs& a) const override {
    const at::ScalarType dtype = a.input_dtype(0);
    return {log_ ? at::_log_softmax_backward_data(a.grad_outputs[0], a.outputs[0], dim_, dtype)
                 : at::_softmax_backward_data(a.grad_outputs[0], a.outputs[0], dim_, dtype)};
  }

 private:
  int64_t dim_;
  bool log_;
};

// Outputs (loss, total_weight); mean reduction, no class weights.
class NllLossOp final : public Op {
 public:
  NllLossOp() : Op(OpTraits::named("nll_loss").saving_inputs({0, 1}).saving_outputs({1}).in_float32()) {}

  TensorList forward(const TensorList& in, const ForwardContext&) const override {
    auto [loss, total_weight] =
        at::nll_loss_forward(in[0], in[1], {}, at::Reduction::Mean, kIgnoreIndex);
    return {loss, total_weight};
  }
  TensorList backward(const BackwardArgs& a) const override {
    return {at::nll_loss_backward(a.grad_outputs[0], a.inputs[0], a.inputs[1], {},
                                  at::Reduction::Mean, kIgnoreIndex, a.outputs[1]),
            at::Tensor()};
  }

 private:
  static constexpr int64_t kIgnoreIndex = -100;
};

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) {
  return detail::apply_first(std::make_shared<SoftmaxOp>(detail::normalize_dim(dim, x.dim()), false),
                             {x});
}

Tensor log_softmax(const Tensor& x, int64_t dim) {
  return detail::apply_first(std::make_shared<SoftmaxOp>(detail::normalize_dim(dim, x.dim()), true),
                             {x});
}

Tensor nll_loss(const Tensor& log_probs, const Tensor& target) {
  TORCH_CHECK(log_probs.dim() == 2 && target.dim() == 1 && target.size(0) == log_probs.size(0),
              "nll_loss: log_probs (N, K) and target (N) expected, got ", log_probs.sizes(),
              " and ", target.sizes());
  TORCH_CHECK(target.dtype() == at::kLong, "nll_loss: target must be int64, got ", target.dtype());
  static const std::shared_ptr<const Op> op = std::make_shared<NllLossOp>();
  return detail::apply_first(op, {log_probs, target});
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target) {
  return nll_loss(log_softmax(logits, 1), target);
}

}  // namespace ht

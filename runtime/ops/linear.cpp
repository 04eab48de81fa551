// Linear algebra ops: linear, matmul, bmm, and the embedding lookup.
#include "runtime/ops/op_util.h"

namespace ht {
namespace {

using detail::bit_if;
using TensorList = std::vector<at::Tensor>;

// y = x W^T + b.  x (..., D_in), W (D_out, D_in), b (D_out)
class LinearOp final : public Op {
 public:
  LinearOp(bool has_bias, bool x_grad, bool w_grad)
      : Op(traits_for(x_grad, w_grad)), has_bias_(has_bias) {}

  TensorList forward(const TensorList& in, const ForwardContext&) const override {
    return {at::linear(in[0], in[1], has_bias_ ? in[2] : at::Tensor())};
  }

  TensorList backward(const BackwardArgs& a) const override {
    const at::Tensor& g = a.grad_outputs[0];  // (..., D_out)
    const int64_t d_out = a.input_sizes(1)[0];
    const int64_t d_in = a.input_sizes(1)[1];
    TensorList grads(a.needs_input_grad.size());
    if (a.needs_input_grad[0]) grads[0] = at::matmul(g, a.inputs[1]);
    if (a.needs_input_grad[1]) {
      grads[1] = g.reshape({-1, d_out}).t().mm(a.inputs[0].reshape({-1, d_in}));
    }
    if (has_bias_ && a.needs_input_grad[2]) grads[2] = g.reshape({-1, d_out}).sum(0);
    return grads;
  }

 private:
  static OpTraits traits_for(bool x_grad, bool w_grad) {
    OpTraits t = OpTraits::named("linear").in_low_precision().doing(Work::kContraction);
    t.saves_inputs = bit_if(w_grad, 0) | bit_if(x_grad, 1);
    return t;
  }
  bool has_bias_;
};

// a (..., N, K) @ b (..., K, M); batch dimensions broadcast.
class MatmulOp final : public Op {
 public:
  MatmulOp(bool batched_only, bool a_grad, bool b_grad)
      : Op(traits_for(batched_only, a_grad, b_grad)), bmm_(batched_only) {}

  TensorList forward(const TensorList& in, const ForwardContext&) const override {
    return {bmm_ ? at::bmm(in[0], in[1]) : at::matmul(in[0], in[1])};
  }

  TensorList backward(const BackwardArgs& a) const override {
    const at::Tensor& g = a.grad_outputs[0];
    TensorList grads(2);
    if (bmm_) {
      if (a.needs_input_grad[0]) grads[0] = at::bmm(g, a.inputs[1].transpose(1, 2));
      if (a.needs_input_grad[1]) grads[1] = at::bmm(a.inputs[0].transpose(1, 2), g);
      return grads;
    }
    if (a.needs_input_grad[0]) {
      grads[0] = at::sum_to(at::matmul(g, a.inputs[1].transpose(-1, -2)), a.input_sizes(0));
    }
    if (a.needs_input_grad[1]) {
      grads[1] = at::sum_to(at::matmul(a.inputs[0].transpose(-1, -2), g), a.input_sizes(1));
    }
    return grads;
  }

 private:
  static OpTraits traits_for(bool bmm, bool a_grad, bool b_grad) {
    OpTraits t = OpTraits::named(bmm ? "bmm" : "matmul").in_low_precision().doing(Work::kContraction);
    t.saves_inputs = bit_if(b_grad, 0) | bit_if(a_grad, 1);
    return t;
  }
  bool bmm_;
};

// weight (V, D), indices (...) -> (..., D)
class EmbeddingOp final : public Op {
 public:
  EmbeddingOp() : Op(OpTraits::named("embedding").saving_inputs({1}).with_low_precision_output()) {}

  TensorList forward(const TensorList& in, const ForwardContext&) const override {
    return {detail::embedding_rows(in[0], in[1])};
  }
  TensorList backward(const BackwardArgs& a) const override {
    return {detail::embedding_rows_backward(a.grad_outputs[0], a.inputs[1], a.input_sizes(0)[0]), at::Tensor()};
  }
};

}  // namespace

namespace detail {

at::Tensor embedding_rows(const at::Tensor& weight, const at::Tensor& indices) {
  if (!weight.is_meta()) return at::embedding(weight, indices);
  std::vector<int64_t> sizes = indices.sizes().vec();
  sizes.push_back(weight.size(1));
  return at::empty(sizes, weight.options());
}

at::Tensor embedding_rows_backward(const at::Tensor& grad, const at::Tensor& indices, int64_t rows) {
  if (!grad.is_meta()) {
    return at::embedding_dense_backward(grad, indices, rows, /*padding_idx=*/-1, /*scale_grad_by_freq=*/false);
  }
  return at::empty({rows, grad.size(-1)}, grad.options());
}

}  // namespace detail

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  TORCH_CHECK(weight.dim() == 2, "linear: weight must be (D_out, D_in), got ", weight.sizes());
  auto op = std::make_shared<LinearOp>(bias.defined(), x.requires_grad(), weight.requires_grad());
  if (bias.defined()) return detail::apply_first(std::move(op), {x, weight, bias});
  return detail::apply_first(std::move(op), {x, weight});
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  TORCH_CHECK(a.dim() >= 2 && b.dim() >= 2, "matmul: both operands must be at least 2-d, got ",
              a.sizes(), " and ", b.sizes());
  return detail::apply_first(std::make_shared<MatmulOp>(false, a.requires_grad(), b.requires_grad()),
                             {a, b});
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  TORCH_CHECK(a.dim() == 3 && b.dim() == 3, "bmm: operands must be 3-d, got ", a.sizes(), " and ",
              b.sizes());
  return detail::apply_first(std::make_shared<MatmulOp>(true, a.requires_grad(), b.requires_grad()),
                             {a, b});
}

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  static const std::shared_ptr<const Op> op = std::make_shared<EmbeddingOp>();
  return detail::apply_first(op, {weight, indices});
}

}  // namespace ht

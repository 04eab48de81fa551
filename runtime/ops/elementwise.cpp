// Elementwise ops: arithmetic with broadcasting, scalar forms, activations, masked_fill.
#include "runtime/ops/op_util.h"

namespace ht {
namespace {

using detail::bit_if;
using detail::reduce_to;
using TensorList = std::vector<at::Tensor>;

enum class Arith { kAdd, kSub, kMul, kDiv };

class BinaryOp final : public Op {
 public:
  // Saves only what the gradients that will be asked for read (as autograd does).
  BinaryOp(Arith kind, bool a_grad, bool b_grad)
      : Op(traits_for(kind, a_grad, b_grad)), kind_(kind) {}

  TensorList forward(const TensorList& in, const ForwardContext&) const override {
    switch (kind_) {
      case Arith::kAdd: return {at::add(in[0], in[1])};
      case Arith::kSub: return {at::sub(in[0], in[1])};
      case Arith::kMul: return {at::mul(in[0], in[1])};
      case Arith::kDiv: return {at::div(in[0], in[1])};
    }
    return {};
  }

  TensorList backward(const BackwardArgs& a) const override {
    const at::Tensor& g = a.grad_outputs[0];
    TensorList grads(2);
    switch (kind_) {
      case Arith::kAdd:
        if (a.needs_input_grad[0]) grads[0] = reduce_to(g, a.input_sizes(0));
        if (a.needs_input_grad[1]) grads[1] = reduce_to(g, a.input_sizes(1));
        break;
      case Arith::kSub:
        if (a.needs_input_grad[0]) grads[0] = reduce_to(g, a.input_sizes(0));
        if (a.needs_input_grad[1]) grads[1] = reduce_to(g.neg(), a.input_sizes(1));
        break;
      case Arith::kMul:
        if (a.needs_input_grad[0]) grads[0] = reduce_to(g * a.inputs[1], a.input_sizes(0));
        if (a.needs_input_grad[1]) grads[1] = reduce_to(g * a.inputs[0], a.input_sizes(1));
        break;
      case Arith::kDiv:
        if (a.needs_input_grad[0]) grads[0] = reduce_to(g / a.inputs[1], a.input_sizes(0));
        if (a.needs_input_grad[1]) {
          grads[1] = reduce_to(-g * ((a.inputs[0] / a.inputs[1]) / a.inputs[1]), a.input_sizes(1));
        }
        break;
    }
    return grads;
  }

 private:
  static OpTraits traits_for(Arith kind, bool a_grad, bool b_grad) {
    OpTraits t;
    switch (kind) {
      case Arith::kAdd:
        t.name = "add";
        t.passing_the_gradient_through();
        break;
      case Arith::kSub: t.name = "sub"; break;
      case Arith::kMul:
        t.name = "mul";
        t.saves_inputs = bit_if(b_grad, 0) | bit_if(a_grad, 1);
        break;
      case Arith::kDiv:
        t.name = "div";
        t.saves_inputs = bit_if(b_grad, 0) | bit_if(a_grad || b_grad, 1);
        break;
    }
    return t;
  }
  Arith kind_;
};

// x + s, x * s, x / s
class ScalarOp final : public Op {
 public:
  ScalarOp(Arith kind, double scalar) : Op(traits_for(kind)), kind_(kind), s_(scalar) {}

  TensorList forward(const TensorList& in, const ForwardContext&) const override {
    switch (kind_) {
      case Arith::kAdd: return {at::add(in[0], s_)};
      case Arith::kMul: return {at::mul(in[0], s_)};
      case Arith::kDiv: return {at::div(in[0], s_)};
      case Arith::kSub: break;
    }
    TORCH_INTERNAL_ASSERT(false, "ScalarOp: unsupported kind");
  }

  TensorList backward(const BackwardArgs& a) const override {
    const at::Tensor& g = a.grad_outputs[0];
    switch (kind_) {
      case Arith::kAdd: return {g};
      case Arith::kMul: return {g * s_};
      case Arith::kDiv: return {g / s_};
      case Arith::kSub: break;
    }
    return {at::Tensor()};
  }

 private:
  // x + s hands its gradient on as it is.
  static OpTraits traits_for(Arith kind) {
    if (kind == Arith::kAdd) return OpTraits::named("add_scalar").passing_the_gradient_through();
    return OpTraits::named(kind == Arith::kMul ? "mul_scalar" : "div_scalar");
  }
  Arith kind_;
  double s_;
};

enum class Activation { kRelu, kGelu, kGeluTanh, kTanh, kSigmoid, kSilu };

class ActivationOp final : public Op {
 public:
  explicit ActivationOp(Activation kind) : Op(traits_for(kind)), kind_(kind) {}

  TensorList forward(const TensorList& in, const ForwardContext&) const override {
    switch (kind_) {
      case Activation::kRelu: return {in[0].is_meta() ? at::empty_like(in[0]) : at::relu(in[0])};  // no 1.13 meta relu
      case Activation::kGelu: return {at::gelu(in[0], "none")};
      case Activation::kGeluTanh: return {at::gelu(in[0], "tanh")};
      case Activation::kTanh: return {at::tanh(in[0])};
      case Activation::kSigmoid: return {at::sigmoid(in[0])};
      case Activation::kSilu: return {at::silu(in[0])};
    }
    return {};
  }

  TensorList backward(const BackwardArgs& a) const override {
    const at::Tensor& g = a.grad_outputs[0];
    switch (kind_) {
      case Activation::kRelu: return {at::threshold_backward(g, a.outputs[0], 0)};
      case Activation::kGelu: return {at::gelu_backward(g, a.inputs[0], "none")};
      case Activation::kGeluTanh: return {at::gelu_backward(g, a.inputs[0], "tanh")};
      case Activation::kTanh: return {at::tanh_backward(g, a.outputs[0])};
      case Activation::kSigmoid: return {at::sigmoid_backward(g, a.outputs[0])};
      case Activation::kSilu: return {at::silu_backward(g, a.inputs[0])};
    }
    return {at::Tensor()};
  }

 private:
  // relu, tanh and sigmoid differentiate from their output, gelu and silu from their input.
  static OpTraits traits_for(Activation kind) {
    OpTraits t;
    switch (kind) {
      case Activation::kRelu: t.name = "relu"; break;
      case Activation::kGelu: t.name = "gelu"; break;
      case Activation::kGeluTanh: t.name = "gelu_tanh"; break;
      case Activation::kTanh: t.name = "tanh"; break;
      case Activation::kSigmoid: t.name = "sigmoid"; break;
      case Activation::kSilu: t.name = "silu"; break;
    }
    const bool from_input =
        kind == Activation::kGelu || kind == Activation::kGeluTanh || kind == Activation::kSilu;
    (from_input ? t.saves_inputs : t.saves_outputs) = OpTraits::bits({0});
    return t;
  }
  Activation kind_;
};

// SwiGLU's product silu(gate) * up of x = [gate | up] (..., 2F) -> (..., F), as one op that saves
// x alone: split, silu and mul saved x (through gate and up, views of it) and silu's output too,
// F more elements a token. Backward recomputes silu(gate); every kernel is the one the three ops
// ran, on the same values, so forward and the gradient are their bits.
class SwigluOp final : public Op {
 public:
  SwigluOp() : Op(OpTraits::named("swiglu").saving_inputs({0})) {}

  TensorList forward(const TensorList& in, const ForwardContext&) const override {
    const int64_t f = in[0].size(-1) / 2;
    return {at::silu(in[0].narrow(-1, 0, f)) * in[0].narrow(-1, f, f)};
  }
  TensorList backward(const BackwardArgs& a) const override {
    const at::Tensor& x = a.inputs[0];
    const at::Tensor& g = a.grad_outputs[0];
    const int64_t f = x.size(-1) / 2;
    const at::Tensor gate = x.narrow(-1, 0, f), up = x.narrow(-1, f, f);
    at::Tensor gx = at::empty(x.sizes(), x.options());
    at::Tensor gx_up = gx.narrow(-1, f, f), gx_gate = gx.narrow(-1, 0, f);
    at::mul_out(gx_up, g, at::silu(gate));
    at::silu_backward_out(gx_gate, g * up, gate);
    return {gx};
  }
};

class MaskedFillOp final : public Op {
 public:
  explicit MaskedFillOp(double value)
      : Op(OpTraits::named("masked_fill").saving_inputs({1})), value_(value) {}

  TensorList forward(const TensorList& in, const ForwardContext&) const override {
    return {at::masked_fill(in[0], in[1], value_)};
  }
  TensorList backward(const BackwardArgs& a) const override {
    return {reduce_to(a.grad_outputs[0].masked_fill(a.inputs[1], 0), a.input_sizes(0)),
            at::Tensor()};
  }

 private:
  double value_;
};

Tensor binary(Arith kind, const Tensor& a, const Tensor& b) {
  return detail::apply_first(std::make_shared<BinaryOp>(kind, a.requires_grad(), b.requires_grad()),
                             {a, b});
}

Tensor activation(Activation kind, const Tensor& x) {
  static const std::shared_ptr<const Op> ops[] = {
      std::make_shared<ActivationOp>(Activation::kRelu),
      std::make_shared<ActivationOp>(Activation::kGelu),
      std::make_shared<ActivationOp>(Activation::kGeluTanh),
      std::make_shared<ActivationOp>(Activation::kTanh),
      std::make_shared<ActivationOp>(Activation::kSigmoid),
      std::make_shared<ActivationOp>(Activation::kSilu)};
  return detail::apply_first(ops[static_cast<int>(kind)], {x});
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) { return binary(Arith::kAdd, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary(Arith::kSub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary(Arith::kMul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary(Arith::kDiv, a, b); }
Tensor add(const Tensor& a, double s) {
  return detail::apply_first(std::make_shared<ScalarOp>(Arith::kAdd, s), {a});
}
Tensor mul(const Tensor& a, double s) {
  return detail::apply_first(std::make_shared<ScalarOp>(Arith::kMul, s), {a});
}
Tensor div(const Tensor& a, double s) {
  return detail::apply_first(std::make_shared<ScalarOp>(Arith::kDiv, s), {a});
}
Tensor relu(const Tensor& x) {
  Interpreter& interp = x.interp();
  if (interp.relu_masks() && interp.grad_enabled() && x.requires_grad()) return detail::relu_with_mask(x);
  return activation(Activation::kRelu, x);
}
Tensor gelu(const Tensor& x, bool tanh_approximation) {
  return activation(tanh_approximation ? Activation::kGeluTanh : Activation::kGelu, x);
}
Tensor tanh(const Tensor& x) { return activation(Activation::kTanh, x); }
Tensor sigmoid(const Tensor& x) { return activation(Activation::kSigmoid, x); }
Tensor silu(const Tensor& x) { return activation(Activation::kSilu, x); }
Tensor swiglu(const Tensor& x) {
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) % 2 == 0, "swiglu: x must be (..., 2F), got ", x.sizes());
  static const std::shared_ptr<const Op> op = std::make_shared<SwigluOp>();
  return detail::apply_first(op, {x});
}
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  TORCH_CHECK(mask.dtype() == at::kBool, "masked_fill: mask must be bool, got ", mask.dtype());
  return detail::apply_first(std::make_shared<MaskedFillOp>(value), {x, mask});
}

}  // namespace ht

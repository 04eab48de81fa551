// Normalization: batch norm (training and evaluation), layer norm and RMS norm.
#include "runtime/ops/op_util.h"
#include "runtime/traced_device.h"

#include <ATen/Parallel.h>

#include <array>
#include <optional>

namespace ht {
namespace {

using TensorList = std::vector<at::Tensor>;

// Training outputs (y, save_mean, save_invstd); evaluation outputs (y). The running statistics
// are module buffers, not interpreter tensors: the first forward updates them, a recomputation
// (ForwardContext::recompute) must not, and evaluation reads them.
// A norm's gradients on meta tensors (libtorch 1.13 has no meta kernel for either norm's
// backward): each input's shape and dtype, the input's own memory format where asked.
// `first`: input 0's gradient as the kernel makes it (the widened type of a 16-bit input).
TensorList meta_gradients(const BackwardArgs& a, bool in_input_layout, std::optional<at::ScalarType> first = {}) {
  TensorList grads(3);
  for (size_t i = 0; i < 3; ++i) {
    if (!a.needs_input_grad[i]) continue;
    const at::TensorOptions options = a.input_options(i);
    grads[i] = at::empty(a.input_sizes(i), i == 0 && first ? options.dtype(*first) : options);
  }
  if (in_input_layout && grads[0].defined()) grads[0] = at::empty_like(a.inputs[0]);
  return grads;
}

class BatchNormOp final : public Op {
 public:
  BatchNormOp(at::Tensor running_mean, at::Tensor running_var, bool training, double momentum,
              double eps)
      : Op(training ? OpTraits::named("batch_norm")
                          .saving_inputs({0, 1})
                          .saving_outputs({1, 2})
                          .with_float32_weights()
                          .with_workspace(Workspace::kBatchNorm)
                    : OpTraits::named("batch_norm_eval").saving_inputs({0, 1}).with_float32_weights()),
        running_mean_(std::move(running_mean)), running_var_(std::move(running_var)),
        training_(training), momentum_(momentum), eps_(eps) {}

  TensorList forward(const TensorList& in, const ForwardContext& ctx) const override {
    const bool update_stats = training_ && !ctx.recompute;
    const at::Tensor rm = (!training_ || update_stats) ? running_mean_ : at::Tensor();
    const at::Tensor rv = (!training_ || update_stats) ? running_var_ : at::Tensor();
    if (in[0].is_meta()) {
      TensorList out = meta_outputs(in);
      WorkspaceQuery q;
      q.input = in[0].sizes();
      const std::vector<at::Tensor> workspace = hold_meta_workspace(traits().workspace, q);
      return out;
    }
    auto [y, save_mean, save_invstd] =
        at::native_batch_norm(in[0], in[1], in[2], rm, rv, training_, momentum_, eps_);
    if (!training_) return {y};
    return {y, save_mean, save_invstd};
  }

  TensorList backward(const BackwardArgs& a) const override {
    const std::array<bool, 3> mask{a.needs_input_grad[0], a.needs_input_grad[1],
                                   a.needs_input_grad[2]};
    if (a.grad_outputs[0].is_meta()) {
      TensorList grads = meta_gradients(a, /*in_input_layout=*/true);
      WorkspaceQuery q;
      q.backward = true;
      q.input = a.inputs[0].sizes();
      q.channels_last = a.inputs[0].suggest_memory_format() == at::MemoryFormat::ChannelsLast;
      const std::vector<at::Tensor> workspace = hold_meta_workspace(traits().workspace, q);
      return grads;
    }
    at::Tensor save_mean, save_invstd, rm, rv;
    if (training_) {
      save_mean = a.outputs[1];
      save_invstd = a.outputs[2];
    } else {
      rm = running_mean_;
      rv = running_var_;
    }
    auto [gx, gw, gb] = at::native_batch_norm_backward(
        a.grad_outputs[0], a.inputs[0], a.inputs[1], rm, rv, save_mean, save_invstd, training_,
        eps_, mask);
    return {gx, gw, gb};
  }
 private:
  // On meta tensors (libtorch 1.13 has no meta kernels for batch norm): y as x, the saved
  // statistics (C) in the weights' dtype; no running statistics to update.
  TensorList meta_outputs(const TensorList& in) const {
    at::Tensor y = at::empty_like(in[0]);
    if (!training_) return {y};
    const at::TensorOptions stats = in[1].defined() ? in[1].options() : in[0].options();
    return {y, at::empty({in[0].size(1)}, stats), at::empty({in[0].size(1)}, stats)};
  }

  at::Tensor running_mean_, running_var_;
  bool training_;
  double momentum_, eps_;
};

// x in the weights' type: a 16-bit x (autocast: Precision::kFloat32Weights keeps the input's
// type and gives fp32 weights) is widened inside the kernel, its statistics and arithmetic in
// fp32; y goes back in x's type, so the residual stream and the norm's output stay 16-bit.
// (Only a 16-bit x widens: a double x meets fp32 weights only by mistake, and fails as before.)
at::Tensor widened(const at::Tensor& x, const at::Tensor& weight) {
  const bool narrow = x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf;
  return narrow && x.scalar_type() != weight.scalar_type() ? x.to(weight.scalar_type()) : x;
}

// The kernel's x, weight and bias. On a GPU a bf16 x is not widened: the widened copy and y's
// narrowing tripled the bytes the op moves, and GPT-2 small's layer norms took 10.2x their price
// forward and 8.2x backward on an H200 (docs/gpu.md, 2026-12-04). ATen's CUDA kernel does not
// take fp32 weights with a 16-bit x ("expected scalar type BFloat16 but found Float", libtorch
// 2.11), so it gets bf16 copies of them, as Megatron's bf16 layout keeps them: the statistics
// stay fp32 inside the kernel, and the weights' gradients come back in bf16 and are widened into
// the fp32 parameters' type. (`scripts/device-kernels.py --only norm`: forward and backward at
// 131,072 rows of 768 in 0.83 ms against 2.27 widened.) A CPU keeps the widened path its bits
// were recorded with.
struct NormArgs {
  at::Tensor x, weight, bias;
};
// Only bf16: fp16's weight gradients, sums over every row of loss-scaled values, could overflow
// where the other gradients do not.
NormArgs kernel_args(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  const bool bf16 = x.scalar_type() == at::kBFloat16 && weight.scalar_type() == at::kFloat;
  if (!bf16 || !runs_as_gpu(x.device())) return {widened(x, weight), weight, bias};
  return {x, weight.to(x.scalar_type()), bias.to(x.scalar_type())};
}
// The output's gradient as the kernel takes it: in its x's type.
at::Tensor in_type_of(const at::Tensor& g, const at::Tensor& x) {
  return g.scalar_type() == x.scalar_type() ? g : g.to(x.scalar_type());
}

// Outputs (y in x's type, mean, rstd in the weights'). Backward reads the bias only to shape its
// gradient; it is a parameter, so saving it costs nothing.
class LayerNormOp final : public Op {
 public:
  LayerNormOp(std::vector<int64_t> normalized_shape, double eps)
      : Op(OpTraits::named("layer_norm")
               .saving_inputs({0, 1, 2})
               .saving_outputs({1, 2})
               .with_float32_weights()
               .with_workspace(Workspace::kLayerNorm)),
        shape_(std::move(normalized_shape)), eps_(eps) {}

  TensorList forward(const TensorList& in, const ForwardContext&) const override {
    const NormArgs k = kernel_args(in[0], in[1], in[2]);
    const at::Tensor& x = k.x;
    if (x.is_meta()) {  // no meta kernel in libtorch 1.13: y as x, mean and rstd (..., 1) in the weights' type
      std::vector<int64_t> stats = x.sizes().vec();
      for (size_t d = 0; d < shape_.size(); ++d) stats[stats.size() - 1 - d] = 1;
      const at::TensorOptions st = x.options().dtype(in[1].scalar_type());
      at::Tensor y = at::empty_like(x), mean = at::empty(stats, st), rstd = at::empty(stats, st);
      return {y.to(in[0].scalar_type()), mean, rstd};
    }
    auto [y, mean, rstd] = at::native_layer_norm(x, shape_, k.weight, k.bias, eps_);
    return {y.to(in[0].scalar_type()), mean.to(in[1].scalar_type()), rstd.to(in[1].scalar_type())};
  }
  TensorList backward(const BackwardArgs& a) const override {
    if (a.grad_outputs[0].is_meta()) {
      // As the data path allocates: the kernel's x, weight and bias (widened, or on a GPU the
      // weights' bf16 copies) and g in x's type, the kernel's gradients (input 0's in that type;
      // the weights' a GPU makes in bf16 and widens, a few KiB, counted in fp32 alone) and
      // workspace, then input 0's gradient in x's type. They go before the gradient is narrowed,
      // as the data path's temporaries do.
      TensorList grads;
      {
        const NormArgs k = kernel_args(a.inputs[0], a.inputs[1], a.inputs[2]);
        const at::Tensor& x = k.x;
        const at::Tensor g = in_type_of(a.grad_outputs[0], x);
        grads = meta_gradients(a, /*in_input_layout=*/false, x.scalar_type());
        WorkspaceQuery q;
        q.backward = true;
        q.weight_grad = a.needs_input_grad[1] || a.needs_input_grad[2];
        q.normalized = 1;
        for (int64_t s : shape_) q.normalized *= s;
        q.threads = at::get_num_threads();
        const std::vector<at::Tensor> workspace = hold_meta_workspace(traits().workspace, q);
      }
      if (grads[0].defined()) grads[0] = grads[0].to(a.input_dtype(0));
      return grads;
    }
    const std::array<bool, 3> mask{a.needs_input_grad[0], a.needs_input_grad[1],
                                   a.needs_input_grad[2]};
    const NormArgs k = kernel_args(a.inputs[0], a.inputs[1], a.inputs[2]);
    const at::Tensor g = in_type_of(a.grad_outputs[0], k.x);
    auto [gx, gw, gb] = at::native_layer_norm_backward(g, k.x, shape_, a.outputs[1], a.outputs[2], k.weight, k.bias, mask);
    const auto as_input = [&](const at::Tensor& t, int i) { return t.defined() ? t.to(a.input_dtype(i)) : t; };
    return {as_input(gx, 0), as_input(gw, 1), as_input(gb, 2)};
  }
 private:
  std::vector<int64_t> shape_;
  double eps_;
};

// Outputs (y in x's type, rstd in the weight's): rstd (..., 1) = 1 / sqrt(mean(x^2) + eps), in
// fp32 for a 16-bit x. libtorch 1.13 has no RMS norm kernel, so both directions are a few ATen
// calls; backward saves x, the weight (a parameter) and rstd, never x^2 or the normalized x:
//   gx = rstd * (g w - x_hat * mean(g w * x_hat)),  gw = sum(g * x_hat) over the leading dims.
class RmsNormOp final : public Op {
 public:
  explicit RmsNormOp(double eps)
      : Op(OpTraits::named("rms_norm").saving_inputs({0, 1}).saving_outputs({1}).with_float32_weights()),
        eps_(eps) {}

  TensorList forward(const TensorList& in, const ForwardContext&) const override {
    const at::Tensor x = widened(in[0], in[1]);
    at::Tensor rstd = at::rsqrt(x.square().mean(-1, /*keepdim=*/true).add_(eps_));
    return {(x * rstd * in[1]).to(in[0].scalar_type()), rstd};
  }
  TensorList backward(const BackwardArgs& a) const override {
    const at::Tensor g = widened(a.grad_outputs[0], a.inputs[1]);
    const at::Tensor x_hat = widened(a.inputs[0], a.inputs[1]) * a.outputs[1];
    at::Tensor gx, gw;
    if (a.needs_input_grad[0]) {
      const at::Tensor gy = g * a.inputs[1];
      gx = (gy - x_hat * (gy * x_hat).mean(-1, /*keepdim=*/true)).mul_(a.outputs[1]).to(a.input_dtype(0));
    }
    if (a.needs_input_grad[1]) gw = at::sum_to(g * x_hat, a.input_sizes(1));
    return {gx, gw};
  }

 private:
  double eps_;
};

}  // namespace

Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                  const at::Tensor& running_mean, const at::Tensor& running_var, bool training,
                  double momentum, double eps) {
  TORCH_CHECK(x.dim() >= 2, "batch_norm: input must be (B, C, ...), got ", x.sizes());
  TORCH_CHECK(weight.defined() && bias.defined(), "batch_norm: weight and bias are required");
  TORCH_CHECK(training || (running_mean.defined() && running_var.defined()),
              "batch_norm: evaluation needs running statistics");
  return detail::apply_first(
      std::make_shared<BatchNormOp>(running_mean, running_var, training, momentum, eps),
      {x, weight, bias});
}

Tensor layer_norm(const Tensor& x, std::vector<int64_t> normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps) {
  TORCH_CHECK(weight.defined() && bias.defined(), "layer_norm: weight and bias are required");
  return detail::apply_first(std::make_shared<LayerNormOp>(std::move(normalized_shape), eps),
                             {x, weight, bias});
}

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  TORCH_CHECK(weight.defined() && weight.dim() == 1 && x.dim() >= 1 && x.size(-1) == weight.size(0),
              "rms_norm: weight must be (D) for x (..., D); got ", weight.sizes(), " and ", x.sizes());
  return detail::apply_first(std::make_shared<RmsNormOp>(eps), {x, weight});
}

}  // namespace ht

// Convolution and pooling (NCHW).
#include "runtime/ops/op_util.h"

#include <ATen/Parallel.h>

#include <array>

namespace ht {
namespace {

using TensorList = std::vector<at::Tensor>;

class Conv2dOp final : public Op {
 public:
  Conv2dOp(Conv2dArgs args, bool has_bias)
      : Op(OpTraits::named("conv2d")
                 .saving_inputs({0, 1})
                 .in_low_precision()
                 .doing(Work::kConvolution)
                 .with_workspace(Workspace::kConvolution)), args_(std::move(args)),
        has_bias_(has_bias) {}

  TensorList forward(const TensorList& in, const ForwardContext&) const override {
    if (in[0].is_meta()) {
      at::Tensor y = meta_output(in[0], in[1]);
      const std::vector<at::Tensor> workspace = hold_meta_workspace(traits().workspace, query(in[0], in[1], y, false, true, true));
      return {y};
    }
    return {at::convolution(in[0], in[1], has_bias_ ? in[2] : at::Tensor(), args_.stride,
                            args_.padding, args_.dilation, /*transposed=*/false,
                            /*output_padding=*/{0, 0}, args_.groups)};
  }

  TensorList backward(const BackwardArgs& a) const override {
    const std::array<bool, 3> mask{a.needs_input_grad[0], a.needs_input_grad[1],
                                   has_bias_ && a.needs_input_grad[2]};
    if (mask[1] && weight_gradient_needs_fp32(a.inputs[0])) {
      auto [gx, gw, gb] = run_backward(a.grad_outputs[0], a.inputs[0], a.inputs[1], a, {mask[0], false, mask[2]});
      auto fp32 = run_backward(a.grad_outputs[0].to(at::kFloat), a.inputs[0].to(at::kFloat),
                               a.inputs[1].to(at::kFloat), a, {false, true, false});
      return finish(gx, std::get<1>(fp32).to(a.input_dtype(1)), gb);
    }
    auto [gx, gw, gb] = run_backward(a.grad_outputs[0], a.inputs[0], a.inputs[1], a, mask);
    return finish(gx, gw, gb);
  }

 private:
  std::tuple<at::Tensor, at::Tensor, at::Tensor> run_backward(const at::Tensor& g, const at::Tensor& x,
                                                              const at::Tensor& w, const BackwardArgs& a,
                                                              std::array<bool, 3> mask) const {
    const std::array<int64_t, 1> bias_sizes{a.input_sizes(1)[0]};
    if (g.is_meta()) {  // libtorch 1.13 has no meta kernel: the gradients' shapes
      std::tuple<at::Tensor, at::Tensor, at::Tensor> grads{
          mask[0] ? at::empty_like(x) : at::Tensor(), mask[1] ? at::empty_like(w) : at::Tensor(),
          mask[2] ? at::empty({bias_sizes[0]}, g.options()) : at::Tensor()};
      const std::vector<at::Tensor> workspace = hold_meta_workspace(traits().workspace, query(x, w, g, true, mask[0], mask[1]));
      return grads;
    }
    return at::convolution_backward(g, x, w, has_bias_ ? at::OptionalIntArrayRef(bias_sizes) : at::OptionalIntArrayRef(),
                                    args_.stride, args_.padding, args_.dilation, /*transposed=*/false,
                                    /*output_padding=*/{0, 0}, args_.groups, mask);
  }
  // The output's shape and memory format on meta tensors (libtorch 1.13 has no meta convolution).
  at::Tensor meta_output(const at::Tensor& x, const at::Tensor& w) const {
    std::vector<int64_t> sizes{x.size(0), w.size(0)};
    for (size_t d = 0; d < 2; ++d) {
      const int64_t extent = args_.dilation[d] * (w.size(static_cast<int64_t>(d) + 2) - 1) + 1;
      sizes.push_back((x.size(static_cast<int64_t>(d) + 2) + 2 * args_.padding[d] - extent) / args_.stride[d] + 1);
    }
    return at::empty(sizes, x.options().memory_format(channels_last(x, w) ? at::MemoryFormat::ChannelsLast
                                                                          : at::MemoryFormat::Contiguous));
  }
  // ATen's rule (mkldnn_ and thnn_conv_use_channels_last): channels-last where either is.
  static bool channels_last(const at::Tensor& x, const at::Tensor& w) {
    return x.suggest_memory_format() == at::MemoryFormat::ChannelsLast ||
           w.suggest_memory_format() == at::MemoryFormat::ChannelsLast;
  }
  WorkspaceQuery query(const at::Tensor& x, const at::Tensor& w, const at::Tensor& y, bool backward,
                       bool input_grad, bool weight_grad) const {
    WorkspaceQuery q;
    q.backward = backward;
    q.input_grad = input_grad;
    q.weight_grad = weight_grad;
    q.channels_last = channels_last(x, w);
    q.input_copied = q.channels_last && !x.is_contiguous(at::MemoryFormat::ChannelsLast);
    q.input = x.sizes();
    q.weight = w.sizes();
    q.output = y.sizes();
    q.stride = args_.stride;
    q.padding = args_.padding;
    q.groups = args_.groups;
    q.element_bytes = static_cast<int64_t>(x.element_size());
    q.threads = at::get_num_threads();
    return q;
  }
  TensorList finish(const at::Tensor& gx, const at::Tensor& gw, const at::Tensor& gb) const {
    TensorList grads{gx, gw};
    if (has_bias_) grads.push_back(gb);
    return grads;
  }
  // libtorch 1.13's oneDNN bf16 kernel returns garbage (inf) in the weight gradient of a strided
  // convolution over a 1-pixel-wide input (tests/runtime/test_ops_conv_pool.cpp has the case);
  // there the gradient is computed in fp32, at no real cost for so small an input.
  bool weight_gradient_needs_fp32(const at::Tensor& x) const {
    if (!x.is_cpu() || (x.scalar_type() != at::kBFloat16 && x.scalar_type() != at::kHalf)) return false;
    for (size_t d = 0; d < 2; ++d)
      if (x.size(static_cast<int64_t>(d) + 2) == 1 && args_.stride[d] > 1) return true;
    return false;
  }

  Conv2dArgs args_;
  bool has_bias_;
};

struct PoolArgs {
  std::vector<int64_t> kernel, stride, padding;
  bool ceil_mode = false;
};

// Outputs (y, indices): indices are hidden, saved for backward as autograd does.
class MaxPool2dOp final : public Op {
 public:
  explicit MaxPool2dOp(PoolArgs args)
      : Op(OpTraits::named("max_pool2d").saving_inputs({0}).saving_outputs({1}).with_workspace(Workspace::kMaxPool)),
        args_(std::move(args)) {}

  TensorList forward(const TensorList& in, const ForwardContext&) const override {
    auto [y, indices] = at::max_pool2d_with_indices(in[0], args_.kernel, args_.stride,
                                                    args_.padding, {1, 1}, args_.ceil_mode);
    return {y, indices};
  }
  TensorList backward(const BackwardArgs& a) const override {
    at::Tensor gx = at::max_pool2d_with_indices_backward(a.grad_outputs[0], a.inputs[0], args_.kernel,
                                                         args_.stride, args_.padding, {1, 1},
                                                         args_.ceil_mode, a.outputs[1]);
    if (gx.is_meta()) {  // ATen's meta kernel allocates the gradient; its CPU kernel may convert
      WorkspaceQuery q;
      q.backward = true;
      q.input = a.inputs[0].sizes();
      q.output = a.outputs[1].sizes();
      q.element_bytes = static_cast<int64_t>(a.inputs[0].element_size());
      q.input_copied = a.grad_outputs[0].suggest_memory_format() != a.inputs[0].suggest_memory_format();
      const std::vector<at::Tensor> workspace = hold_meta_workspace(traits().workspace, q);
    }
    return {gx};
  }

 private:
  PoolArgs args_;
};

class AvgPool2dOp final : public Op {
 public:
  AvgPool2dOp(PoolArgs args, bool count_include_pad)
      : Op(OpTraits::named("avg_pool2d").saving_inputs({0})), args_(std::move(args)),
        count_include_pad_(count_include_pad) {}

  TensorList forward(const TensorList& in, const ForwardContext&) const override {
    return {at::avg_pool2d(in[0], args_.kernel, args_.stride, args_.padding, args_.ceil_mode,
                           count_include_pad_, c10::nullopt)};
  }
  TensorList backward(const BackwardArgs& a) const override {
    return {at::avg_pool2d_backward(a.grad_outputs[0], a.inputs[0], args_.kernel, args_.stride,
                                    args_.padding, args_.ceil_mode, count_include_pad_,
                                    c10::nullopt)};
  }

 private:
  PoolArgs args_;
  bool count_include_pad_;
};

// Output 1x1 is a mean over H and W and saves nothing (as ATen's adaptive_avg_pool2d does);
// other sizes use the adaptive kernel, whose backward reads the input.
class AdaptiveAvgPool2dOp final : public Op {
 public:
  explicit AdaptiveAvgPool2dOp(std::vector<int64_t> output_size)
      : Op(traits_for(output_size)), output_size_(std::move(output_size)) {}

  TensorList forward(const TensorList& in, const ForwardContext&) const override {
    if (global()) return {in[0].mean({-1, -2}, /*keepdim=*/true)};
    return {at::_adaptive_avg_pool2d(in[0], output_size_)};
  }
  TensorList backward(const BackwardArgs& a) const override {
    const at::Tensor& g = a.grad_outputs[0];
    if (global()) {
      const auto sizes = a.input_sizes(0);
      const int64_t hw = sizes[sizes.size() - 1] * sizes[sizes.size() - 2];
      return {g.expand(sizes) / hw};
    }
    return {at::_adaptive_avg_pool2d_backward(g, a.inputs[0])};
  }

 private:
  bool global() const { return output_size_[0] == 1 && output_size_[1] == 1; }
  static OpTraits traits_for(const std::vector<int64_t>& output_size) {
    OpTraits t = OpTraits::named("adaptive_avg_pool2d");
    if (!(output_size[0] == 1 && output_size[1] == 1)) t.saves_inputs = OpTraits::bits({0});
    return t;
  }
  std::vector<int64_t> output_size_;
};

PoolArgs pool_args(const Tensor& x, std::vector<int64_t> kernel, std::vector<int64_t> stride,
                   std::vector<int64_t> padding, bool ceil_mode, const char* op) {
  TORCH_CHECK(x.dim() == 4, op, ": input must be (B, C, H, W), got ", x.sizes());
  TORCH_CHECK(kernel.size() == 2 && padding.size() == 2, op, ": kernel and padding take 2 values");
  if (stride.empty()) stride = kernel;
  return PoolArgs{std::move(kernel), std::move(stride), std::move(padding), ceil_mode};
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dArgs& args) {
  TORCH_CHECK(x.dim() == 4 && weight.dim() == 4, "conv2d: input (B, C, H, W) and weight ",
              "(C_out, C_in/groups, kH, kW) expected, got ", x.sizes(), " and ", weight.sizes());
  auto op = std::make_shared<Conv2dOp>(args, bias.defined());
  if (bias.defined()) return detail::apply_first(std::move(op), {x, weight, bias});
  return detail::apply_first(std::move(op), {x, weight});
}

Tensor max_pool2d(const Tensor& x, std::vector<int64_t> kernel, std::vector<int64_t> stride,
                  std::vector<int64_t> padding, bool ceil_mode) {
  return detail::apply_first(
      std::make_shared<MaxPool2dOp>(pool_args(x, std::move(kernel), std::move(stride),
                                              std::move(padding), ceil_mode, "max_pool2d")),
      {x});
}

Tensor avg_pool2d(const Tensor& x, std::vector<int64_t> kernel, std::vector<int64_t> stride,
                  std::vector<int64_t> padding, bool ceil_mode, bool count_include_pad) {
  return detail::apply_first(
      std::make_shared<AvgPool2dOp>(pool_args(x, std::move(kernel), std::move(stride),
                                              std::move(padding), ceil_mode, "avg_pool2d"),
                                    count_include_pad),
      {x});
}

Tensor adaptive_avg_pool2d(const Tensor& x, std::vector<int64_t> output_size) {
  TORCH_CHECK(x.dim() == 4 && output_size.size() == 2,
              "adaptive_avg_pool2d: input (B, C, H, W) and a 2-value output size expected");
  return detail::apply_first(std::make_shared<AdaptiveAvgPool2dOp>(std::move(output_size)), {x});
}

}  // namespace ht

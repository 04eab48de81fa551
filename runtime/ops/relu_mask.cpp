// relu under memory.compress (Interpreter::set_relu_masks): the same output, and for backward a
// 1-bit mask of where it was positive (runtime/bit_mask.h) instead of the output itself. The
// gradient is the same bit for bit: threshold_backward passes the gradient where the output is
// above 0 and writes 0 elsewhere, as the mask does. (Only a NaN output differs: threshold_backward
// passes its gradient, the mask, NaN > 0 being false, does not.)
#include "runtime/bit_mask.h"
#include "runtime/ops/op_util.h"

#include <ATen/ATen.h>

namespace ht {
namespace {

using TensorList = std::vector<at::Tensor>;

// The mask is packed in the output's memory order (contiguous or channels-last), and backward
// rebuilds from it a tensor of the output's layout, so threshold_backward lays its gradient out as
// it would have from the output itself: the layout decides later kernels' summation order, so
// bit-identity needs it.
class ReluMaskOp final : public Op {
 public:
  explicit ReluMaskOp(at::MemoryFormat format)
      : Op(OpTraits::named("relu_mask").saving_outputs({1})), channels_last_(format == at::MemoryFormat::ChannelsLast) {}

  TensorList forward(const TensorList& in, const ForwardContext&) const override {
    at::Tensor out = at::relu(in[0]);
    at::Tensor positive = out.gt(0);
    positive = channels_last_ ? positive.contiguous(at::MemoryFormat::ChannelsLast).permute({0, 2, 3, 1})
                              : positive.contiguous();
    at::Tensor mask = pack_bits(positive);  // memory order: the permuted view is contiguous
    return {std::move(out), std::move(mask)};
  }

  TensorList backward(const BackwardArgs& a) const override {
    const at::Tensor& g = a.grad_outputs[0];
    const at::IntArrayRef sizes = a.input_sizes(0);
    at::Tensor positive;
    if (channels_last_) {
      positive = unpack_bits(a.outputs[1], {sizes[0], sizes[2], sizes[3], sizes[1]}).permute({0, 3, 1, 2});
    } else {
      positive = unpack_bits(a.outputs[1], sizes);
    }
    // 1 where the output was positive, 0 elsewhere, in its layout: threshold_backward's result
    // is the same, bit for bit and stride for stride, as from the output.
    return {at::threshold_backward(g, positive.to(g.scalar_type()), 0)};
  }

 private:
  bool channels_last_;
};

}  // namespace

namespace detail {

Tensor relu_with_mask(const Tensor& x) {
  static const std::shared_ptr<const Op> contiguous = std::make_shared<ReluMaskOp>(at::MemoryFormat::Contiguous);
  static const std::shared_ptr<const Op> channels_last = std::make_shared<ReluMaskOp>(at::MemoryFormat::ChannelsLast);
  const at::Tensor& value = x.value();
  const bool cl = value.dim() == 4 && value.suggest_memory_format() == at::MemoryFormat::ChannelsLast;
  return apply_first(cl ? channels_last : contiguous, {x});
}

}  // namespace detail
}  // namespace ht

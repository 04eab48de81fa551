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

class ReluMaskOp final : public Op {
 public:
  ReluMaskOp() : Op(OpTraits::named("relu_mask").saving_outputs({1})) {}

  TensorList forward(const TensorList& in, const ForwardContext&) const override {
    at::Tensor out = at::relu(in[0]);
    at::Tensor mask = pack_bits(out.gt(0));
    return {std::move(out), std::move(mask)};
  }

  TensorList backward(const BackwardArgs& a) const override {
    const at::Tensor positive = unpack_bits(a.outputs[1], a.input_sizes(0));
    return {a.grad_outputs[0].masked_fill(positive.logical_not(), 0)};
  }
};

}  // namespace

namespace detail {

Tensor relu_with_mask(const Tensor& x) {
  static const std::shared_ptr<const Op> op = std::make_shared<ReluMaskOp>();
  return apply_first(op, {x});
}

}  // namespace detail
}  // namespace ht

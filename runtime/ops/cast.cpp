// The dtype conversion that automatic mixed precision inserts (and models may call): an ordinary
// recorded op, so a cast copy can be evicted and recomputed from its source.
#include "runtime/ops/op_util.h"

namespace ht {
namespace {

using TensorList = std::vector<at::Tensor>;

class CastOp final : public Op {
 public:
  explicit CastOp(at::ScalarType dtype) : Op(traits()), dtype_(dtype) {}

  TensorList forward(const TensorList& in, const ForwardContext&) const override {
    return {in[0].to(dtype_)};
  }
  // The gradient goes back in the source's type: a bf16 copy of an fp32 weight hands the weight
  // an fp32 gradient, which is where accumulation across micro-batches happens.
  TensorList backward(const BackwardArgs& a) const override {
    return {a.grad_outputs[0].to(a.input_dtype(0))};
  }

 private:
  static OpTraits traits() {
    return OpTraits::named("cast").keeping_input_types().converting_its_input_type();
  }
  at::ScalarType dtype_;
};

}  // namespace

Tensor cast(const Tensor& x, at::ScalarType dtype) {
  if (x.dtype() == dtype) return x;
  TORCH_CHECK(at::isFloatingType(x.dtype()) && at::isFloatingType(dtype), "cast: ", x.dtype(), " to ", dtype,
              ": only floating types convert (gradients flow back through the cast)");
  return detail::apply_first(std::make_shared<CastOp>(dtype), {x});
}

}  // namespace ht

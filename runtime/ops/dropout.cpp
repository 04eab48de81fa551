// Dropout: the one random op. Its mask comes from a private generator seeded with a number
// drawn from the interpreter's seed stream when the op is applied, so a recomputation (or the
// reference run in autograd mode) draws the same mask and the global generator is untouched.
#include "base/compat.h"
#include "runtime/ops/op_util.h"

namespace ht {
namespace {

using TensorList = std::vector<at::Tensor>;

// Outputs (y, mask): the bool mask is hidden and saved for backward (1 byte per element).
class DropoutOp final : public Op {
 public:
  DropoutOp(double p, uint64_t seed)
      : Op(OpTraits::named("dropout").saving_outputs({1}).drawing_random_numbers()), p_(p),
        seed_(seed) {}

  TensorList forward(const TensorList& in, const ForwardContext&) const override {
    const at::Tensor& x = in[0];
    at::Tensor mask = at::empty(x.sizes(), x.options().dtype(at::kBool));
    // A meta tensor (a traced step) has a shape and no values to draw, nor a generator to draw them.
    if (!x.is_meta()) mask.bernoulli_(1.0 - p_, compat::seeded_generator(x.device(), seed_));
    return {at::mul(x, mask).mul_(scale()), mask};
  }
  TensorList backward(const BackwardArgs& a) const override {
    return {at::mul(a.grad_outputs[0], a.outputs[1]).mul_(scale())};
  }

 private:
  double scale() const { return 1.0 / (1.0 - p_); }
  double p_;
  uint64_t seed_;
};

}  // namespace

Tensor dropout(const Tensor& x, double p, bool training) {
  TORCH_CHECK(p >= 0.0 && p < 1.0, "dropout: p must be in [0, 1), got ", p);
  if (!training || p == 0.0) return x;
  return detail::apply_first(std::make_shared<DropoutOp>(p, x.interp().next_seed()), {x});
}

}  // namespace ht

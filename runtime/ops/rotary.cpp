// Rotary position embedding (RoPE, Su et al. 2021), as Llama uses it on queries and keys.
// Interleaved pairs, the layout of Meta's reference code and torchtitan: features (2i, 2i+1) of
// each head are a 2-vector rotated by the angle p * theta^(-2i / hd) at position p. Hugging
// Face's implementation pairs feature i with i + hd/2 instead ("rotate_half"); its checkpoints
// hold the q and k projections with rows permuted to match, and our export applies the same
// permutation. The op is one kernel each way and saves nothing: the gradient of a rotation is
// the inverse rotation of the gradient. Angles are computed in double and applied in fp32 (or
// the input's type, if wider), then cast back, so bf16 activations lose nothing to the tables.
#include "runtime/ops/op_util.h"

namespace ht {
namespace {

using TensorList = std::vector<at::Tensor>;

class RopeOp final : public Op {
 public:
  RopeOp(double theta, int64_t offset) : Op(OpTraits::named("rope")), theta_(theta), offset_(offset) {}

  TensorList forward(const TensorList& in, const ForwardContext&) const override {
    return {rotate(in[0], /*sign=*/1.0)};
  }
  TensorList backward(const BackwardArgs& a) const override {
    return {rotate(a.grad_outputs[0], /*sign=*/-1.0)};
  }

 private:
  // x (B, T, H, hd) rotated by sign * angle.
  at::Tensor rotate(const at::Tensor& x, double sign) const {
    const int64_t t = x.size(1), hd = x.size(3);
    const at::ScalarType compute = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    const auto dopts = at::TensorOptions().dtype(at::kDouble).device(x.device());
    // inv_freq (hd/2) = theta^(-2i/hd); angle (T, 1, hd/2) = position * inv_freq
    const at::Tensor inv_freq = at::pow(theta_, at::arange(0, hd, 2, dopts).div_(-static_cast<double>(hd)));
    const at::Tensor angle = at::outer(at::arange(offset_, offset_ + t, dopts), inv_freq).unsqueeze(1);
    const at::Tensor c = angle.cos().to(compute), s = angle.sin().mul_(sign).to(compute);
    const at::Tensor pairs = x.to(compute).unflatten(-1, {hd / 2, 2});  // (B, T, H, hd/2, 2)
    const at::Tensor x0 = pairs.select(-1, 0), x1 = pairs.select(-1, 1);
    const at::Tensor out = at::stack({x0 * c - x1 * s, x0 * s + x1 * c}, -1).flatten(-2);
    return out.to(x.scalar_type());
  }

  double theta_;
  int64_t offset_;
};

}  // namespace

Tensor rope(const Tensor& x, double theta, int64_t offset) {
  TORCH_CHECK(x.dim() == 4 && x.size(3) % 2 == 0, "rope: x must be (B, T, H, hd) with hd even, got ", x.sizes());
  TORCH_CHECK(theta > 1.0 && offset >= 0, "rope: theta must be > 1 and offset >= 0, got ", theta, " and ", offset);
  return detail::apply_first(std::make_shared<RopeOp>(theta, offset), {x});
}

}  // namespace ht

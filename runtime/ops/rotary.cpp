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
  RopeOp(double theta, std::vector<SequencePiece> pieces)
      : Op(OpTraits::named("rope")), theta_(theta), pieces_(std::move(pieces)) {}

  TensorList forward(const TensorList& in, const ForwardContext&) const override {
    return {rotate(in[0], /*sign=*/1.0)};
  }
  TensorList backward(const BackwardArgs& a) const override {
    return {rotate(a.grad_outputs[0], /*sign=*/-1.0)};
  }

 private:
  // x (B, T, H, hd) rotated by sign * angle.
  at::Tensor rotate(const at::Tensor& x, double sign) const {
    const int64_t hd = x.size(3);
    const at::ScalarType compute = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    const auto dopts = at::TensorOptions().dtype(at::kDouble).device(x.device());
    // inv_freq (hd/2) = theta^(-2i/hd); angle (T, 1, hd/2) = position * inv_freq
    const at::Tensor inv_freq = at::pow(theta_, at::arange(0, hd, 2, dopts).div_(-static_cast<double>(hd)));
    std::vector<at::Tensor> runs;  // the rows' positions
    for (const SequencePiece& p : pieces_) runs.push_back(at::arange(p.position, p.position + p.length, dopts));
    const at::Tensor positions = runs.size() == 1 ? runs[0] : at::cat(runs);
    const at::Tensor angle = at::outer(positions, inv_freq).unsqueeze(1);
    const at::Tensor c = angle.cos().to(compute), s = angle.sin().mul_(sign).to(compute);
    const at::Tensor pairs = x.to(compute).unflatten(-1, {hd / 2, 2});  // (B, T, H, hd/2, 2)
    const at::Tensor x0 = pairs.select(-1, 0), x1 = pairs.select(-1, 1);
    const at::Tensor out = at::stack({x0 * c - x1 * s, x0 * s + x1 * c}, -1).flatten(-2);
    return out.to(x.scalar_type());
  }

  double theta_;
  std::vector<SequencePiece> pieces_;  // rows [row, row + length) at positions [position, ...)
};

}  // namespace

Tensor rope(const Tensor& x, double theta, int64_t offset) {
  TORCH_CHECK(x.dim() == 4, "rope: x must be (B, T, H, hd), got ", x.sizes());
  TORCH_CHECK(offset >= 0, "rope: offset must be >= 0, got ", offset);
  return rope(x, theta, std::vector<SequencePiece>{{0, offset, x.size(1)}});
}

Tensor rope(const Tensor& x, double theta, const std::vector<SequencePiece>& pieces) {
  TORCH_CHECK(x.dim() == 4 && x.size(3) % 2 == 0, "rope: x must be (B, T, H, hd) with hd even, got ", x.sizes());
  TORCH_CHECK(theta > 1.0, "rope: theta must be > 1, got ", theta);
  int64_t rows = 0;
  for (const SequencePiece& p : pieces) {
    TORCH_CHECK(p.row == rows && p.length >= 0 && p.position >= 0,
                "rope: pieces must cover x's rows in order at positions >= 0; a piece at row ", p.row, " follows ", rows,
                " rows");
    rows += p.length;
  }
  TORCH_CHECK(rows == x.size(1), "rope: the pieces cover ", rows, " rows of x's ", x.size(1));
  return detail::apply_first(std::make_shared<RopeOp>(theta, pieces), {x});
}

}  // namespace ht

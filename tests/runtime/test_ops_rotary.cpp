// rope: forward and gradient equal an independent formulation, Meta's reference one: each pair
// (2i, 2i+1) as a complex number multiplied by e^(i * p * theta^(-2i/hd)), under autograd.
#include "tests/support/op_check.h"

#include <cmath>

namespace ht::test {
namespace {

at::Tensor complex_rope(const at::Tensor& x, double theta, int64_t offset) {
  const int64_t t = x.size(1), hd = x.size(3);
  const auto opts = x.options().dtype(at::kDouble).requires_grad(false);
  const at::Tensor inv_freq = 1.0 / at::pow(theta, at::arange(0, hd, 2, opts) / static_cast<double>(hd));
  const at::Tensor angle = at::outer(at::arange(offset, offset + t, opts), inv_freq).unsqueeze(1);
  const at::Tensor rotation = at::polar(at::ones_like(angle), angle);  // (T, 1, hd/2) complex
  const at::Tensor z = at::view_as_complex(x.reshape({x.size(0), t, x.size(2), hd / 2, 2}).contiguous());
  return at::view_as_real(z * rotation).flatten(-2);
}

TEST(OpsRotary, RopeRotatesInterleavedPairsLikeTheComplexForm) {
  at::manual_seed(0);
  for (int64_t offset : {0, 5}) {
    for (const std::vector<int64_t>& shape : {std::vector<int64_t>{2, 7, 3, 8}, std::vector<int64_t>{1, 1, 1, 2}}) {
      SCOPED_TRACE(::testing::Message() << "shape " << at::IntArrayRef(shape) << " offset " << offset);
      check_op({{rnd(shape)},
                [=](auto&, auto& t) { return one(rope(t[0], 10000.0, offset)); },
                [=](auto& t) { return one(complex_rope(t[0], 10000.0, offset)); },
                {},
                1e-12,
                1e-12});
    }
  }
}

TEST(OpsRotary, RopeAtPositionZeroIsTheIdentity) {
  Interpreter interp;
  const at::Tensor x = at::randn({1, 1, 2, 6});
  EXPECT_TRUE(rope(interp.input(x), 500000.0).value().equal(x));
}

TEST(OpsRotary, RopeKeepsBf16InputsInBf16) {
  Interpreter interp;
  const at::Tensor x = at::randn({2, 4, 2, 8}).to(at::kBFloat16);
  const at::Tensor y = rope(interp.input(x), 10000.0).value();
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(all_close(y.to(at::kDouble), complex_rope(x.to(at::kDouble), 10000.0, 0), 0, 0.05));
}

TEST(OpsRotary, RopeRefusesAnOddHeadDimension) {
  Interpreter interp;
  EXPECT_THROW(rope(interp.input(at::ones({1, 2, 1, 3})), 10000.0), c10::Error);
}

}  // namespace
}  // namespace ht::test

// linear, matmul, bmm, embedding: forward and gradients equal libtorch autograd (float64).
#include "tests/support/op_check.h"

namespace ht::test {
namespace {

TEST(OpsLinear, LinearWithAndWithoutBias2dAnd3d) {
  at::manual_seed(0);
  for (std::vector<int64_t> xs : {std::vector<int64_t>{5, 3}, std::vector<int64_t>{2, 4, 3}}) {
    const at::Tensor x = rnd(xs), w = rnd({6, 3}), b = rnd({6});
    check_op({{x, w, b}, [](auto&, auto& t) { return one(linear(t[0], t[1], t[2])); },
              [](auto& t) { return one(at::linear(t[0], t[1], t[2])); }});
    check_op({{x, w}, [](auto&, auto& t) { return one(linear(t[0], t[1])); },
              [](auto& t) { return one(at::linear(t[0], t[1])); }});
  }
}

TEST(OpsLinear, LinearOnNonContiguousInput) {
  at::manual_seed(1);
  const at::Tensor x = rnd({3, 5}), w = rnd({4, 5}), b = rnd({4});
  check_op({{x, w, b},
            [](auto&, auto& t) { return one(linear(transpose(reshape(t[0], {5, 3}), 0, 1), t[1], t[2])); },
            [](auto& t) { return one(at::linear(t[0].reshape({5, 3}).t(), t[1], t[2])); }});
}

TEST(OpsLinear, MatmulBatchedAndBroadcast) {
  at::manual_seed(2);
  check_op({{rnd({2, 3, 4, 5}), rnd({2, 3, 5, 6})},
            [](auto&, auto& t) { return one(matmul(t[0], t[1])); },
            [](auto& t) { return one(at::matmul(t[0], t[1])); }});
  check_op({{rnd({2, 3, 4, 5}), rnd({5, 6})}, [](auto&, auto& t) { return one(matmul(t[0], t[1])); },
            [](auto& t) { return one(at::matmul(t[0], t[1])); }});
  check_op({{rnd({4, 5}), rnd({3, 5, 2})}, [](auto&, auto& t) { return one(matmul(t[0], t[1])); },
            [](auto& t) { return one(at::matmul(t[0], t[1])); }});
}

TEST(OpsLinear, Bmm) {
  at::manual_seed(3);
  check_op({{rnd({3, 4, 5}), rnd({3, 5, 2})}, [](auto&, auto& t) { return one(bmm(t[0], t[1])); },
            [](auto& t) { return one(at::bmm(t[0], t[1])); }});
}

TEST(OpsLinear, EmbeddingWithRepeatedIndices) {
  at::manual_seed(4);
  const at::Tensor w = rnd({10, 4});
  const at::Tensor idx = at::tensor({1, 3, 3, 9, 0, 1}, at::kLong).reshape({2, 3});
  check_op({{w, idx}, [](auto&, auto& t) { return one(embedding(t[0], t[1])); },
            [](auto& t) { return one(at::embedding(t[0], t[1])); }});
}

TEST(OpsLinear, RejectsBadShapes) {
  Interpreter interp;
  Tensor v = interp.input(at::zeros({3}));
  Tensor m = interp.input(at::zeros({3, 3}));
  EXPECT_THROW(matmul(v, m), c10::Error);
  EXPECT_THROW(linear(m, v), c10::Error);
  EXPECT_THROW(bmm(m, m), c10::Error);
}

}  // namespace
}  // namespace ht::test

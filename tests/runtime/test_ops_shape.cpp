// Shape ops and reductions: forward and gradients equal libtorch autograd (float64),
// multi-output split included.
#include "tests/support/op_check.h"

namespace ht::test {
namespace {

TEST(OpsShape, ReshapeViewTransposePermute) {
  at::manual_seed(0);
  const at::Tensor x = rnd({2, 3, 4});
  check_op({{x}, [](auto&, auto& t) { return one(reshape(t[0], {6, -1})); },
            [](auto& t) { return one(t[0].reshape({6, -1})); }});
  check_op({{x}, [](auto&, auto& t) { return one(view(t[0], {4, 6})); },
            [](auto& t) { return one(t[0].view({4, 6})); }});
  check_op({{x}, [](auto&, auto& t) { return one(transpose(t[0], 0, -1)); },
            [](auto& t) { return one(t[0].transpose(0, -1)); }});
  check_op({{x}, [](auto&, auto& t) { return one(permute(t[0], {1, 2, 0})); },
            [](auto& t) { return one(t[0].permute({1, 2, 0})); }});
  // reshape of a non-contiguous view copies
  check_op({{x}, [](auto&, auto& t) { return one(reshape(transpose(t[0], 1, 2), {2, 12})); },
            [](auto& t) { return one(t[0].transpose(1, 2).reshape({2, 12})); }});
}

TEST(OpsShape, ContiguousCopiesAStridedViewAndAliasesADenseOne) {
  at::manual_seed(4);
  const at::Tensor x = rnd({3, 8});
  check_op({{x}, [](auto&, auto& t) { return one(contiguous(slice(t[0], 1, 2, 6))); },
            [](auto& t) { return one(t[0].slice(1, 2, 6).contiguous()); }});
  Interpreter interp;
  const Tensor dense = interp.input(at::ones({2, 3}));
  EXPECT_TRUE(contiguous(dense).value().is_alias_of(dense.value()));
  EXPECT_FALSE(contiguous(transpose(dense, 0, 1)).value().is_alias_of(dense.value()));
}

TEST(OpsShape, SliceWithStepAndNegativeBounds) {
  at::manual_seed(1);
  const at::Tensor x = rnd({5, 7});
  check_op({{x}, [](auto&, auto& t) { return one(slice(t[0], 1, 1, 6, 2)); },
            [](auto& t) { return one(t[0].slice(1, 1, 6, 2)); }});
  check_op({{x}, [](auto&, auto& t) { return one(slice(t[0], 0, -3, 100)); },
            [](auto& t) { return one(t[0].slice(0, -3, 100)); }});
}

TEST(OpsShape, CatAndSplit) {
  at::manual_seed(2);
  check_op({{rnd({2, 3}), rnd({2, 5}), rnd({2, 1})},
            [](auto&, auto& t) { return one(cat({t[0], t[1], t[2]}, 1)); },
            [](auto& t) { return one(at::cat({t[0], t[1], t[2]}, 1)); }});
  const at::Tensor x = rnd({7, 3});
  check_op({{x}, [](auto&, auto& t) { return split(t[0], 3, 0); },
            [](auto& t) {
              auto pieces = t[0].split(3, 0);
              return std::vector<at::Tensor>(pieces.begin(), pieces.end());
            }});
  // A piece that receives no gradient contributes zeros.
  check_op({{x}, [](auto&, auto& t) { return split(t[0], 3, 0); },
            [](auto& t) {
              auto pieces = t[0].split(3, 0);
              return std::vector<at::Tensor>(pieces.begin(), pieces.end());
            },
            {true, false, true}});
}

TEST(OpsShape, SumAndMean) {
  at::manual_seed(3);
  const at::Tensor x = rnd({2, 3, 4});
  check_op({{x}, [](auto&, auto& t) { return one(sum(t[0])); },
            [](auto& t) { return one(t[0].sum()); }});
  check_op({{x}, [](auto&, auto& t) { return one(mean(t[0])); },
            [](auto& t) { return one(t[0].mean()); }});
  check_op({{x}, [](auto&, auto& t) { return one(sum(t[0], {0, 2})); },
            [](auto& t) { return one(t[0].sum(at::IntArrayRef{0, 2})); }});
  check_op({{x}, [](auto&, auto& t) { return one(mean(t[0], {-1}, true)); },
            [](auto& t) { return one(t[0].mean({-1}, true)); }});
}

}  // namespace
}  // namespace ht::test

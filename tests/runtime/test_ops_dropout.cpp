// dropout: the mask comes from the interpreter's seed stream, forward and gradient match the
// same mask computed by hand under autograd, and evaluation is the identity.
#include "base/compat.h"
#include "tests/support/op_check.h"

namespace ht::test {
namespace {

TEST(OpsDropout, MatchesSeededMaskUnderAutograd) {
  at::manual_seed(0);
  const at::Tensor x = at::randn({8, 16}, at::kDouble);
  const double p = 0.3;
  const uint64_t interp_seed = 11;
  // The seed the op will draw: the first of the interpreter's stream.
  const uint64_t op_seed = Interpreter(InterpreterOptions{ExecutionMode::kInterpreted, interp_seed}).next_seed();
  OpCheck check{{x}, [p](auto&, auto& t) { return one(dropout(t[0], p, true)); },
                [p, op_seed](auto& t) {
                  at::Generator gen = compat::seeded_generator(t[0].device(), op_seed);
                  at::Tensor mask =
                      at::empty(t[0].sizes(), t[0].options().dtype(at::kBool)).bernoulli_(1 - p, gen);
                  return one(t[0] * mask / (1 - p));
                }};
  check.seed = interp_seed;
  check_op(check);
}

TEST(OpsDropout, DropsRoughlyPAndScales) {
  Interpreter interp(InterpreterOptions{ExecutionMode::kInterpreted, 3});
  Tensor y = dropout(interp.input(at::ones({100000})), 0.25, true);
  const at::Tensor v = y.value();
  const double kept = (v != 0).to(at::kDouble).mean().item<double>();
  EXPECT_NEAR(kept, 0.75, 0.01);
  EXPECT_FLOAT_EQ(v.max().item<float>(), static_cast<float>(1.0 / 0.75));
}

TEST(OpsDropout, EvaluationIsIdentityAndDrawsNoSeed) {
  Interpreter interp;
  Tensor x = interp.input(at::ones({4}));
  Tensor y = dropout(x, 0.5, false);
  EXPECT_EQ(y.info(), x.info());
  EXPECT_EQ(interp.seed_counter(), 0u);
  EXPECT_THROW(dropout(x, 1.0, true), c10::Error);
}

TEST(OpsDropout, DifferentCallsDrawDifferentMasks) {
  Interpreter interp;
  Tensor x = interp.input(at::ones({1000}));
  EXPECT_FALSE(dropout(x, 0.5, true).value().equal(dropout(x, 0.5, true).value()));
}

}  // namespace
}  // namespace ht::test

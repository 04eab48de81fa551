// Automatic mixed precision: the cast op's gradient, each op's declared precision, one cast per
// weight per forward, fp32 gradients for fp32 weights, and the same numbers in both execution modes.
#include "tests/support/op_check.h"

namespace ht::test {
namespace {

TEST(Autocast, CastOpConvertsAndItsGradientConvertsBack) {
  at::manual_seed(0);
  check_op({{at::randn({4, 3})},
            [](auto&, auto& t) { return one(cast(mul(t[0], 3.0), at::kBFloat16)); },
            [](auto& t) { return one((t[0] * 3.0).to(at::kBFloat16)); }});
  Interpreter interp;
  const Tensor x = interp.input(at::ones({2}));
  EXPECT_EQ(cast(x, at::kFloat).info(), x.info()) << "already that type: no op";
  EXPECT_THROW(cast(interp.input(at::ones({2}, at::kLong)), at::kFloat), c10::Error);
}

TEST(Autocast, EachOpRunsInItsDeclaredPrecision) {
  at::manual_seed(1);
  Interpreter interp;
  interp.set_autocast(at::kBFloat16);
  const at::Tensor w = at::randn({6, 4}).requires_grad_(true), g = at::ones({6}).requires_grad_(true);
  const Tensor x = interp.input(at::randn({3, 4}));
  const Tensor h = linear(x, interp.param(w));  // low precision
  EXPECT_EQ(h.dtype(), at::kBFloat16);
  EXPECT_EQ(relu(h).dtype(), at::kBFloat16) << "elementwise follows its input";
  const Tensor residual = interp.input(at::randn({3, 6}));
  EXPECT_EQ(add(h, residual).dtype(), at::kFloat) << "bf16 + fp32: the widest";
  const Tensor n = layer_norm(h, {6}, interp.param(g), interp.param(at::zeros({6})), 1e-5);
  EXPECT_EQ(n.dtype(), at::kBFloat16) << "layer norm: statistics in fp32, the activation's type out";
  EXPECT_EQ(rms_norm(h, interp.param(g), 1e-5).dtype(), at::kBFloat16) << "RMS norm likewise";
  EXPECT_EQ(layer_norm(residual, {6}, interp.param(g), interp.param(at::zeros({6})), 1e-5).dtype(), at::kFloat);
  const Tensor rows = embedding(interp.param(at::randn({5, 4}).requires_grad_(true)),
                                interp.input(at::tensor({0, 4}, at::kLong)));
  EXPECT_EQ(rows.dtype(), at::kBFloat16) << "an embedding's rows start the residual stream in 16 bits";
  const at::Tensor running_mean = at::zeros({6}), running_var = at::ones({6});
  const Tensor bn = batch_norm(reshape(h, {3, 6, 1}), interp.param(g), interp.param(at::zeros({6})), running_mean,
                               running_var, true, 0.1, 1e-5);
  EXPECT_EQ(bn.dtype(), at::kBFloat16) << "batch norm: fp32 weights and statistics, the activation's type";
  EXPECT_EQ(running_mean.scalar_type(), at::kFloat);
  EXPECT_EQ(softmax(h, 1).dtype(), at::kFloat);
  EXPECT_EQ(sum(h).dtype(), at::kFloat) << "reductions in fp32";
  const Tensor d = interp.input(at::randn({3, 4}, at::kDouble));
  EXPECT_EQ(linear(d, interp.input(at::randn({2, 4}, at::kDouble))).dtype(), at::kDouble) << "doubles are left alone";

  const Tensor loss = cross_entropy(h, interp.input(at::tensor({0, 5, 2}, at::kLong)));
  EXPECT_EQ(loss.dtype(), at::kFloat);
  interp.backward(loss);
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().scalar_type(), at::kFloat) << "an fp32 weight gets an fp32 gradient";
}

TEST(Autocast, AWeightIsCastOncePerForwardAndAgainAfterAnUpdate) {
  at::manual_seed(2);
  Interpreter interp;
  interp.set_autocast(at::kBFloat16);
  const at::Tensor w = at::randn({4, 4}).requires_grad_(true);
  const Tensor x = interp.input(at::randn({2, 4}));
  // Two uses, each through its own leaf (as models make them): one shared bf16 copy.
  const Tensor y1 = linear(x, interp.param(w)), y2 = linear(y1, interp.param(w));
  const TensorInfo* copy1 = y1.info()->producer->inputs[1].get();
  const TensorInfo* copy2 = y2.info()->producer->inputs[1].get();
  EXPECT_EQ(copy1, copy2);
  EXPECT_EQ(copy1->dtype, at::kBFloat16);
  interp.backward(sum(y2));
  const at::Tensor both_uses = w.grad().clone();
  {
    at::NoGradGuard no_grad;
    w.add_(1.0);  // what the optimizer does between steps
  }
  const Tensor y3 = linear(x, interp.param(w));
  EXPECT_TRUE(y3.value().equal(at::linear(x.value().to(at::kBFloat16), w.detach().to(at::kBFloat16))))
      << "the updated weight, not a stale copy";
  EXPECT_GT(both_uses.abs().sum().item<double>(), 0.0);
}

// The output layer in chunks under bf16 autocast: every chunk's product reads the one bf16 copy of
// the weight, and the copy sums the chunks' gradients in the weight's own fp32, as one product's
// accumulator sums its rows: the weight's gradient is as close to float64's as the whole layer's.
// (Summed in bf16, each chunk's addition rounded it again.)
TEST(Autocast, ACopyReadByManyProductsSumsTheirGradientsInItsSourcesType) {
  at::manual_seed(4);
  const int64_t rows = 4096, classes = 1000;
  ASSERT_LT(linear_cross_entropy_rows(rows, classes), rows / 4) << "chunks, or the test tests nothing";
  const at::Tensor x0 = at::randn({rows, 64}), w0 = at::randn({classes, 64}) * 0.2;
  const at::Tensor target = at::randint(classes, {rows}, at::kLong);
  at::Tensor reference = w0.to(at::kDouble).requires_grad_(true);
  at::cross_entropy_loss(at::linear(x0.to(at::kDouble), reference), target).backward();
  auto error = [&](bool chunked) {
    Interpreter interp;
    interp.set_autocast(at::kBFloat16);
    at::Tensor w = w0.clone().requires_grad_(true);
    const Tensor x = interp.input(x0), t = interp.input(target);
    interp.backward(chunked ? linear_cross_entropy(x, interp.param(w), t) : cross_entropy(linear(x, interp.param(w)), t));
    return ((w.grad().to(at::kDouble) - reference.grad()).abs().max() / reference.grad().abs().max()).item<double>();
  };
  const double whole = error(false), chunks = error(true);
  std::printf("the weight's gradient against float64's: whole %.3g, in chunks %.3g\n", whole, chunks);
  EXPECT_LE(chunks, 1.5 * whole);
}

TEST(Autocast, InterpreterAndAutogradAgreeUnderAutocast) {
  at::manual_seed(3);
  const at::Tensor x0 = at::randn({5, 8}), w1 = at::randn({16, 8}), w2 = at::randn({3, 16});
  const at::Tensor y0 = at::tensor({0, 2, 1, 1, 0}, at::kLong);
  std::vector<at::Tensor> losses, grads;
  for (ExecutionMode mode : {ExecutionMode::kInterpreted, ExecutionMode::kAutograd}) {
    Interpreter interp(InterpreterOptions{mode, 1});
    interp.set_autocast(at::kBFloat16);
    at::Tensor a = w1.clone().requires_grad_(true), b = w2.clone().requires_grad_(true);
    const Tensor h = gelu(linear(interp.input(x0), interp.param(a)));
    const Tensor n = layer_norm(h, {16}, interp.input(at::ones({16})), interp.input(at::zeros({16})), 1e-5);
    const Tensor loss = cross_entropy(linear(n, interp.param(b)), interp.input(y0));
    interp.backward(loss);
    losses.push_back(loss.value().detach().clone());
    grads.push_back(a.grad().clone());
    grads.push_back(b.grad().clone());
  }
  EXPECT_TRUE(losses[0].equal(losses[1])) << "the same kernels and casts in both modes";
  // Our backward kernels and autograd's may round bf16 differently: a bf16 ulp of tolerance.
  EXPECT_TRUE(all_close(grads[0], grads[2], 1e-2, 1e-3));
  EXPECT_TRUE(all_close(grads[1], grads[3], 1e-2, 1e-3));
  EXPECT_EQ(grads[0].scalar_type(), at::kFloat);
}

}  // namespace
}  // namespace ht::test

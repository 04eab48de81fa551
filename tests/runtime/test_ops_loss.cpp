// softmax, log_softmax, nll_loss, cross_entropy: forward and gradients equal libtorch (float64).
#include "tests/support/op_check.h"

#include <optional>

namespace ht::test {
namespace {

TEST(OpsLoss, SoftmaxAndLogSoftmaxAnyDim) {
  at::manual_seed(0);
  const at::Tensor x = rnd({3, 4, 5});
  for (int64_t dim : {0, 1, -1}) {
    SCOPED_TRACE(::testing::Message() << "dim " << dim);
    check_op({{x}, [dim](auto&, auto& t) { return one(softmax(t[0], dim)); },
              [dim](auto& t) { return one(at::softmax(t[0], dim)); }});
    check_op({{x}, [dim](auto&, auto& t) { return one(log_softmax(t[0], dim)); },
              [dim](auto& t) { return one(at::log_softmax(t[0], dim)); }});
  }
}

TEST(OpsLoss, SoftmaxWithMaskedRows) {
  at::manual_seed(1);
  const at::Tensor x = rnd({2, 4, 4});
  const at::Tensor mask = at::ones({4, 4}, at::kBool).triu(1);
  const double inf = std::numeric_limits<double>::infinity();
  check_op({{x, mask},
            [inf](auto&, auto& t) { return one(softmax(masked_fill(t[0], t[1], -inf), -1)); },
            [inf](auto& t) { return one(at::softmax(t[0].masked_fill(t[1], -inf), -1)); }});
}

TEST(OpsLoss, NllLossAndCrossEntropy) {
  at::manual_seed(2);
  const at::Tensor logits = rnd({6, 5});
  const at::Tensor target = at::tensor({0, 4, 2, 2, 1, 3}, at::kLong);
  check_op({{logits, target},
            [](auto&, auto& t) { return one(nll_loss(log_softmax(t[0], 1), t[1])); },
            [](auto& t) { return one(at::nll_loss(at::log_softmax(t[0], 1), t[1])); }});
  check_op({{logits, target}, [](auto&, auto& t) { return one(cross_entropy(t[0], t[1])); },
            [](auto& t) { return one(at::cross_entropy_loss(t[0], t[1])); }});
}

TEST(OpsLoss, BackwardFromScalarLoss) {
  Interpreter interp;
  at::Tensor w = at::randn({4, 3}, at::kDouble).requires_grad_(true);
  Tensor loss = cross_entropy(interp.param(w), interp.input(at::tensor({0, 1, 2, 0}, at::kLong)));
  interp.backward(loss);
  at::Tensor w_ref = w.detach().clone().requires_grad_(true);
  at::cross_entropy_loss(w_ref, at::tensor({0, 1, 2, 0}, at::kLong)).backward();
  EXPECT_TRUE(all_close(w.grad(), w_ref.grad()));
}

// The one op against nll_loss(log_softmax) on the same data, every seventh row ignored: the loss
// and the logits' gradient equal to the bit. Under `autocast` (bf16 logits) the op takes the
// logits as they are and casts a chunk at a time, where the two-op form's log_softmax is fed an
// fp32 cast of them: the loss is fp32 and the gradient the logits' type either way.
void expect_the_two_op_form_to_the_bit(int64_t rows, int64_t classes, const at::TensorOptions& options,
                                       std::optional<at::ScalarType> autocast = std::nullopt) {
  at::manual_seed(5);
  const at::Tensor logits = (at::randn({rows, classes}) * 3).to(options);
  at::Tensor target = at::randint(classes, {rows}, at::kLong);
  const at::Tensor ignored = at::arange(0, rows, 7);
  target.index_put_({ignored}, -100);
  target = target.to(options.device());
  auto run = [&](bool fused) {
    Interpreter interp;
    if (autocast) interp.set_autocast(*autocast);
    at::Tensor w = logits.clone().requires_grad_(true);
    Tensor x = interp.param(w), t = interp.input(target);
    Tensor loss = fused ? cross_entropy(x, t) : nll_loss(log_softmax(x, 1), t);
    const at::Tensor value = loss.value().clone();
    interp.backward(loss);
    return std::make_pair(value.cpu(), w.grad().cpu());
  };
  const auto [fused_loss, fused_grad] = run(true);
  const auto [loss, grad] = run(false);
  EXPECT_EQ(fused_loss.scalar_type(), at::kFloat);
  EXPECT_EQ(fused_grad.scalar_type(), logits.scalar_type());
  EXPECT_TRUE(at::equal(fused_loss, loss)) << fused_loss.item<float>() << " vs " << loss.item<float>();
  EXPECT_TRUE(at::equal(fused_grad, grad));
  EXPECT_TRUE(at::equal(grad.index({ignored}), at::zeros({ignored.numel(), classes}, grad.options())))
      << "ignored rows";
}

TEST(OpsLoss, CrossEntropyIsTheTwoOpFormToTheBitInChunks) {
  // 300 rows of 5000 classes: chunks of 53 rows (1 MiB of log-probabilities), the last short.
  expect_the_two_op_form_to_the_bit(300, 5000, at::TensorOptions());
}

TEST(OpsLoss, CrossEntropyIsTheTwoOpFormToTheBitInChunksOnAGpu) {
  // GPT-2's vocabulary over 2048 rows: chunks of 128 rows (CUDA's softmax and loss kernels).
  if (!at::hasCUDA()) GTEST_SKIP() << "no GPU here";
  expect_the_two_op_form_to_the_bit(2048, 50257, at::TensorOptions().device(at::kCUDA, 0));
}

// Under bf16 autocast no fp32 copy of the logits, nor of their gradient, exists in the op.
TEST(OpsLoss, CrossEntropyTakesBf16LogitsAsTheCastFormToTheBit) {
  expect_the_two_op_form_to_the_bit(300, 5000, at::TensorOptions().dtype(at::kBFloat16), at::kBFloat16);
  if (at::hasCUDA()) {
    expect_the_two_op_form_to_the_bit(300, 5000, at::TensorOptions().device(at::kCUDA, 0).dtype(at::kBFloat16),
                                      at::kBFloat16);
  }
}

// The output layer and its loss together (linear_cross_entropy) against libtorch's linear and
// cross entropy, float64: 1200 rows of 1000 classes are chunks of 525 rows (2 MiB of fp32
// logits), the last short, every seventh row ignored; x and the weight get their gradients
// (the weight's summed over the chunks, x's put together from its pieces).
TEST(OpsLoss, LinearCrossEntropyInChunksIsLibtorchs) {
  EXPECT_EQ(linear_cross_entropy_rows(1200, 1000), 525);
  EXPECT_EQ(linear_cross_entropy_rows(1024, 256), 2048);  // GPT's bytes-sized vocabulary: one chunk
  at::manual_seed(6);
  const at::Tensor x = rnd({1200, 16}), w = rnd({1000, 16}) * 0.3;
  at::Tensor target = at::randint(1000, {1200}, at::kLong);
  target.index_put_({at::arange(0, 1200, 7)}, -100);
  check_op({{x, w, target},
            [](auto&, auto& t) { return one(linear_cross_entropy(t[0], t[1], t[2])); },
            [](auto& t) { return one(at::cross_entropy_loss(at::linear(t[0], t[1]), t[2])); }, {}, 1e-12, 1e-12});
}

TEST(OpsLoss, RejectsBadTargets) {
  Interpreter interp;
  Tensor logits = interp.input(at::zeros({4, 3}));
  EXPECT_THROW(nll_loss(logits, interp.input(at::zeros({4}))), c10::Error);       // float target
  EXPECT_THROW(nll_loss(logits, interp.input(at::zeros({3}, at::kLong))), c10::Error);  // size
  EXPECT_THROW(cross_entropy(logits, interp.input(at::zeros({4}))), c10::Error);
  EXPECT_THROW(cross_entropy(logits, interp.input(at::zeros({3}, at::kLong))), c10::Error);
  EXPECT_THROW(linear_cross_entropy(logits, interp.input(at::zeros({5, 4})), interp.input(at::zeros({4}, at::kLong))),
               c10::Error);  // D 3 against the weight's 4
}

}  // namespace
}  // namespace ht::test

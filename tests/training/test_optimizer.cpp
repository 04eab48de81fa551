// The optimizer step's pieces: fp16's skipped step and loss scale, the learning-rate schedule and
// global-norm clipping (training/optimizer.h).
#include "training/optimizer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <cstring>
#include <limits>

namespace ht::test {
namespace {

TEST(Optimizer, AStepWithAnInfGradientIsSkippedAndTheScaleBacksOff) {
  const float inf = std::numeric_limits<float>::infinity();
  OptimizerOptions t;
  at::Tensor a = at::ones({3}).requires_grad_(true), b = at::ones({2}).requires_grad_(true);
  const std::vector<at::Tensor> params{a, b};
  torch::optim::SGD sgd(params, torch::optim::SGDOptions(0.5).momentum(0.9));
  LossScaler scaler(LossScalerOptions{8.0, 2.0, 0.5, 2});
  a.mutable_grad() = at::full({3}, 8.0);
  b.mutable_grad() = at::tensor({8.0f, inf});  // injected
  StepOutcome outcome = optimizer_step(sgd, params, t, 0.5, &scaler);
  EXPECT_FALSE(outcome.stepped);
  EXPECT_TRUE(a.equal(at::ones({3}))) << "parameters untouched";
  EXPECT_TRUE(b.equal(at::ones({2})));
  EXPECT_TRUE(sgd.state().empty()) << "no momentum buffer was made";
  EXPECT_EQ(scaler.scale(), 4.0);
  EXPECT_EQ(scaler.skipped_steps(), 1);
  for (int step = 0; step < 2; ++step) {
    clear_grads(params);
    a.mutable_grad() = at::full({3}, scaler.scale());  // a gradient of 1, scaled
    b.mutable_grad() = at::zeros({2});
    outcome = optimizer_step(sgd, params, t, 0.5, &scaler);
    EXPECT_TRUE(outcome.stepped);
    EXPECT_NEAR(outcome.grad_norm.item<double>(), std::sqrt(3.0), 1e-6) << "the norm of the unscaled gradient";
  }
  // SGD with momentum 0.9 on gradient 1: steps of 0.5 and 0.5 * 1.9.
  EXPECT_TRUE(at::allclose(a, at::full({3}, 1.0 - 0.5 - 0.95)));
  EXPECT_EQ(scaler.scale(), 8.0) << "grown after 2 good steps";
}

TEST(Optimizer, WarmupThenCosineToMinLr) {
  OptimizerOptions t;
  t.lr = 1.0;
  t.min_lr = 0.1;
  t.warmup_steps = 4;
  t.schedule = LrSchedule::kCosine;
  EXPECT_DOUBLE_EQ(learning_rate_at(t, 0, 14), 0.25);
  EXPECT_DOUBLE_EQ(learning_rate_at(t, 3, 14), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate_at(t, 4, 14), 1.0);
  // Cosine over steps 4..13: at step 9, progress 5/9.
  EXPECT_DOUBLE_EQ(learning_rate_at(t, 9, 14), 0.1 + 0.45 * (1.0 + std::cos(M_PI * 5.0 / 9.0)));
  for (int64_t s = 5; s < 14; ++s) EXPECT_LT(learning_rate_at(t, s, 14), learning_rate_at(t, s - 1, 14));
  EXPECT_DOUBLE_EQ(learning_rate_at(t, 13, 14), 0.1);
  t.schedule = LrSchedule::kConstant;
  EXPECT_DOUBLE_EQ(learning_rate_at(t, 13, 14), 1.0);
}

TEST(Optimizer, ClipScalesToTheMaximumNorm) {
  at::Tensor a = at::zeros({2}).requires_grad_(true), b = at::zeros({1}).requires_grad_(true);
  a.mutable_grad() = at::tensor({3.0f, 0.0f});
  b.mutable_grad() = at::tensor({4.0f});
  EXPECT_NEAR(clip_grad_norm({a, b}, 0.0), 5.0, 1e-9) << "0: measure only";
  EXPECT_NEAR(clip_grad_norm({a, b}, 1.0), 5.0, 1e-9);
  EXPECT_NEAR(clip_grad_norm({a, b}, 0.0), 1.0, 1e-5);
}

TEST(Optimizer, TheClippingCoefficientIsTheHostsArithmeticWhereTheNormIs) {
  // Computed where the norm is (a GPU's step never reads it), bit for bit the host's formula.
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (const double max_norm : {1.0, 2.5, 0.3}) {
    for (const double norm : {0.0, 0.25, 1.0, 1.0000001, 2.5, 3.7, 123456.789, 1e30, inf, nan}) {
      const double host = norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
      const at::Tensor coefficient = clip_coefficient(max_norm, at::scalar_tensor(norm, at::kDouble));
      ASSERT_EQ(coefficient.dim(), 0);
      ASSERT_EQ(coefficient.scalar_type(), at::kDouble);
      EXPECT_EQ(std::memcmp(coefficient.data_ptr<double>(), &host, sizeof host), 0)
          << "max " << max_norm << ", norm " << norm << ": " << coefficient.item<double>() << " against " << host;
    }
  }
  EXPECT_FALSE(clip_coefficient(0.0, at::scalar_tensor(5.0, at::kDouble)).defined()) << "0: no clipping";
  EXPECT_EQ(combine_norms(at::empty({0}, at::kDouble)).item<double>(), 0.0) << "no gradients: norm 0";
}

}  // namespace
}  // namespace ht::test

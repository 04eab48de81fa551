// Dynamic loss scaling: exact unscaling, the inf/NaN check, backoff and growth.
#include "training/loss_scaler.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <limits>

namespace ht {
namespace {

at::Tensor param_with_grad(at::Tensor grad) {
  at::Tensor p = at::zeros(grad.sizes()).requires_grad_(true);
  p.mutable_grad() = std::move(grad);
  return p;
}

TEST(LossScaler, UnscalesExactlyAndReportsFiniteGradients) {
  LossScaler scaler(LossScalerOptions{1024.0, 2.0, 0.5, 10});
  const at::Tensor g = at::randn({5});
  at::Tensor p = param_with_grad(g * 1024.0), no_grad = at::zeros({2}).requires_grad_(true);
  EXPECT_TRUE(scaler.unscale({p, no_grad})) << "a parameter without a gradient is skipped";
  EXPECT_TRUE(p.grad().equal(g)) << "a power-of-two scale divides exactly";
}

TEST(LossScaler, AnInfOrNanGradientIsReported) {
  LossScaler scaler;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(scaler.unscale({param_with_grad(at::ones({3})), param_with_grad(at::tensor({1.0f, inf}))}));
  EXPECT_FALSE(scaler.unscale({param_with_grad(at::tensor({nan}))}));
}

TEST(LossScaler, BacksOffOnASkipAndGrowsAfterTheInterval) {
  LossScaler scaler(LossScalerOptions{1024.0, 2.0, 0.5, 3});
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 512.0);
  EXPECT_EQ(scaler.skipped_steps(), 1);
  scaler.update(true);
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 512.0) << "two good steps of three";
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 256.0) << "a skip restarts the count";
  for (int i = 0; i < 3; ++i) scaler.update(true);
  EXPECT_EQ(scaler.scale(), 512.0);
  EXPECT_EQ(scaler.state().good_steps, 0);
  EXPECT_EQ(scaler.skipped_steps(), 2);
  LossScaler resumed;
  resumed.restore(scaler.state());
  EXPECT_EQ(resumed.scale(), 512.0);
  EXPECT_EQ(resumed.skipped_steps(), 2);
}

TEST(LossScaler, RefusesNonsenseOptions) {
  EXPECT_THROW(LossScaler(LossScalerOptions{0.0, 2.0, 0.5, 10}), c10::Error);
  EXPECT_THROW(LossScaler(LossScalerOptions{1.0, 2.0, 1.5, 10}), c10::Error);
}

}  // namespace
}  // namespace ht

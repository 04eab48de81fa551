// The fused optimizer (training/fused_optimizer.h) against torch::optim on the same parameters and
// gradients: AdamW (with and without weight decay) and SGD (with and without momentum and weight
// decay), bit for bit, over several steps at changing learning rates, on sizes that leave a tail
// beside the vector width and that split across threads; the clipping coefficient applied inside
// the pass equals scaling the gradients first; a parameter the pass does not take (double) steps as
// torch::optim steps it.
#include "training/fused_optimizer.h"
#include "training/optimizer.h"

#include "base/compat.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
#include <memory>

namespace ht::test {
namespace {

using MakeOptimizer = std::function<std::unique_ptr<torch::optim::Optimizer>(const std::vector<at::Tensor>&)>;

// The pass reproduces libtorch 1.13's CPU kernels (CI's) bit for bit; another version's kernels
// (2.x on the GPU machine) round otherwise, so there the same steps agree within rounding.
::testing::AssertionResult same_bits(const at::Tensor& a, const at::Tensor& b) {
#ifdef HT_LIBTORCH_1_13
  if (a.equal(b)) return ::testing::AssertionSuccess();
#else
  const bool bf16 = a.scalar_type() == at::kBFloat16;  // a moment an fp32 rounding can move by one bf16 step
  if (at::allclose(a.to(at::kFloat), b.to(at::kFloat), bf16 ? 8e-3 : 1e-5, 1e-6)) return ::testing::AssertionSuccess();
#endif
  return ::testing::AssertionFailure() << "largest difference "
                                       << (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

std::vector<at::Tensor> parameters(at::ScalarType dtype) {
  at::manual_seed(5);
  std::vector<at::Tensor> out;
  for (int64_t n : {1, 7, 33, 1000, 70001}) out.push_back(at::randn({n}, at::TensorOptions().dtype(dtype)).requires_grad_(true));
  out.push_back(at::randn({37, 41}, at::TensorOptions().dtype(dtype)).requires_grad_(true));
  return out;
}

std::vector<at::Tensor> copies(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : params) out.push_back(p.detach().clone().requires_grad_(true));
  return out;
}

// Steps both optimizers `steps` times on the same gradients; the reference's gradients are
// multiplied by `scale` first, the fused one is told it. Every parameter and state tensor must
// be the same bits after every step.
// With `bf16_gradients` the fused one's gradients are bf16 (training.gradient_dtype = "bf16") and
// the reference's the same values widened.
void expect_same_steps(const MakeOptimizer& fused_of, const MakeOptimizer& reference_of, at::ScalarType dtype,
                       double scale = 1.0, int steps = 4, bool bf16_gradients = false) {
  std::vector<at::Tensor> mine = parameters(dtype), theirs = copies(mine);
  std::unique_ptr<torch::optim::Optimizer> fused = fused_of(mine), reference = reference_of(theirs);
  for (int step = 0; step < steps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    at::manual_seed(100 + step);
    const double lr = 0.01 * (step + 1);
    set_learning_rate(*fused, lr);
    set_learning_rate(*reference, lr);
    for (size_t i = 0; i < mine.size(); ++i) {
      at::Tensor g = at::randn(mine[i].sizes(), mine[i].options().requires_grad(false)) * (step % 2 == 0 ? 1e-3 : 5.0);
      if (bf16_gradients) g = g.to(at::kBFloat16);
      mine[i].mutable_grad() = g.clone();
      theirs[i].mutable_grad() = g.to(mine[i].scalar_type());
      if (scale != 1.0) theirs[i].mutable_grad().mul_(scale);
    }
    dynamic_cast<FusedStep&>(*fused).set_gradient_scale(scale);
    fused->step();
    reference->step();
    for (size_t i = 0; i < mine.size(); ++i) {
      SCOPED_TRACE("parameter of " + std::to_string(mine[i].numel()) + " elements");
      EXPECT_TRUE(same_bits(mine[i], theirs[i]));
      const std::vector<at::Tensor> a = optimizer_state(*fused, mine[i]), b = optimizer_state(*reference, theirs[i]);
      ASSERT_EQ(a.size(), b.size());
      for (size_t k = 0; k < a.size(); ++k) EXPECT_TRUE(same_bits(a[k], b[k])) << "state tensor " << k;
    }
  }
}

// Leaf copies of `host` on the GPU.
std::vector<at::Tensor> on_gpu(const std::vector<at::Tensor>& host) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : host) out.push_back(p.detach().to(at::kCUDA).requires_grad_(true));
  return out;
}

MakeOptimizer adamw(double weight_decay, bool fused) {
  return [=](const std::vector<at::Tensor>& p) -> std::unique_ptr<torch::optim::Optimizer> {
    const auto o = torch::optim::AdamWOptions(0.01).betas({0.9, 0.95}).eps(1e-8).weight_decay(weight_decay);
    if (fused) return std::make_unique<FusedAdamW>(p, o);
    return std::make_unique<torch::optim::AdamW>(p, o);
  };
}

MakeOptimizer sgd(double momentum, double weight_decay, bool fused) {
  return [=](const std::vector<at::Tensor>& p) -> std::unique_ptr<torch::optim::Optimizer> {
    const auto o = torch::optim::SGDOptions(0.01).momentum(momentum).weight_decay(weight_decay);
    if (fused) return std::make_unique<FusedSgd>(p, o);
    return std::make_unique<torch::optim::SGD>(p, o);
  };
}

TEST(FusedOptimizer, AdamWIsTorchOptimsBitForBit) {
  for (double wd : {0.0, 0.1}) {
    SCOPED_TRACE("weight decay " + std::to_string(wd));
    expect_same_steps(adamw(wd, true), adamw(wd, false), at::kFloat);
  }
}

TEST(FusedOptimizer, SgdIsTorchOptimsBitForBit) {
  for (double momentum : {0.0, 0.9}) {
    for (double wd : {0.0, 1e-4}) {
      SCOPED_TRACE("momentum " + std::to_string(momentum) + ", weight decay " + std::to_string(wd));
      expect_same_steps(sgd(momentum, wd, true), sgd(momentum, wd, false), at::kFloat);
    }
  }
}

TEST(FusedOptimizer, TheClippingCoefficientInsideThePassIsScalingTheGradientsFirst) {
  expect_same_steps(adamw(0.1, true), adamw(0.1, false), at::kFloat, 0.37);
  expect_same_steps(sgd(0.9, 1e-4, true), sgd(0.9, 1e-4, false), at::kFloat, 0.37);
}

TEST(FusedOptimizer, AParameterThePassDoesNotTakeStepsAsTorchOptimSteps) {
  expect_same_steps(adamw(0.1, true), adamw(0.1, false), at::kDouble, 0.5);
  expect_same_steps(sgd(0.9, 1e-4, true), sgd(0.9, 1e-4, false), at::kDouble, 0.5);
}

// training.gradient_dtype = "bf16": a bf16 gradient is read widened (exactly) by the pass and by
// the path the pass does not take (double parameters): the steps of its widened values, clipped or not.
TEST(FusedOptimizer, ABf16GradientStepsAsItsWidenedValues) {
  for (at::ScalarType dtype : {at::kFloat, at::kDouble}) {
    for (double scale : {1.0, 0.37}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + ", scale " + std::to_string(scale));
      expect_same_steps(adamw(0.1, true), adamw(0.1, false), dtype, scale, 4, true);
      expect_same_steps(sgd(0.9, 1e-4, true), sgd(0.9, 1e-4, false), dtype, scale, 4, true);
      expect_same_steps(sgd(0.0, 0.0, true), sgd(0.0, 0.0, false), dtype, scale, 4, true);
    }
  }
}

// The clipping coefficient is one step's: the next step reads the gradients as they are. A
// gradient whose size is not its parameter's is refused before anything changes.
TEST(FusedOptimizer, TheScaleIsOneStepsAndAMisshapenGradientIsRefused) {
  std::vector<at::Tensor> mine = parameters(at::kFloat), theirs = copies(mine);
  std::unique_ptr<torch::optim::Optimizer> fused = adamw(0.1, true)(mine), reference = adamw(0.1, false)(theirs);
  for (int step = 0; step < 2; ++step) {
    for (size_t i = 0; i < mine.size(); ++i) {
      const at::Tensor g = at::randn(mine[i].sizes());
      mine[i].mutable_grad() = g.clone();
      theirs[i].mutable_grad() = step == 0 ? g * 0.5 : g.clone();
    }
    if (step == 0) dynamic_cast<FusedStep&>(*fused).set_gradient_scale(0.5);
    fused->step();
    reference->step();
  }
  for (size_t i = 0; i < mine.size(); ++i) EXPECT_TRUE(same_bits(mine[i], theirs[i]));
  const at::Tensor before = mine[0].detach().clone();
  mine[0].mutable_grad() = at::ones({mine[0].numel() + 3});
  EXPECT_THROW(fused->step(), c10::Error);
  EXPECT_TRUE(mine[0].equal(before)) << "nothing changed";
}

// training.optimizer_state_dtype = "bf16": the moments are torch::optim's, each rounded to bf16
// (nearest even) after every step and widened before the next; the parameters are the fp32 update
// of those widened moments. Both paths: the pass (contiguous parameters) and libtorch's kernels
// on widened copies (a transposed one the pass does not take). A state read in fp32 (a
// checkpoint's) is rounded at its next step, and one read in bf16 widened.
TEST(FusedOptimizer, Bf16MomentsAreTorchOptimsRoundedToNearestEvenAfterEachStep) {
  std::vector<at::Tensor> mine = parameters(at::kFloat);
  mine.push_back(at::randn({29, 31}).t().requires_grad_(true));  // not contiguous: libtorch's kernels
  std::vector<at::Tensor> theirs = copies(mine);
  std::unique_ptr<torch::optim::Optimizer> fused = adamw(0.1, true)(mine), reference = adamw(0.1, false)(theirs);
  auto& f = dynamic_cast<FusedAdamW&>(*fused);
  for (int step = 0; step < 5; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    // Step 0 in fp32 (a checkpoint's state), then bf16 to step 3, then fp32 again.
    const bool narrow = step >= 1 && step <= 3, was_narrow = step >= 2 && step <= 4;
    f.set_state_dtype(narrow ? at::kBFloat16 : at::kFloat);
    at::manual_seed(200 + step);
    set_learning_rate(*fused, 0.01 * (step + 1));
    set_learning_rate(*reference, 0.01 * (step + 1));
    for (size_t i = 0; i < mine.size(); ++i) {
      const at::Tensor g = at::randn(mine[i].sizes()) * (step % 2 == 0 ? 1e-3 : 5.0);
      mine[i].mutable_grad() = g.clone();
      theirs[i].mutable_grad() = g.clone();
      // The reference reads its moments as the fused step will: rounded where they were kept in
      // bf16 or are rounded as this step converts them.
      const std::vector<at::Tensor> state = optimizer_state(*reference, theirs[i]);
      if ((narrow || was_narrow) && !state.empty()) {
        for (size_t k = 1; k < state.size(); ++k) state[k].copy_(state[k].to(at::kBFloat16).to(at::kFloat));
      }
    }
    fused->step();
    reference->step();
    for (size_t i = 0; i < mine.size(); ++i) {
      SCOPED_TRACE("parameter of " + std::to_string(mine[i].numel()) + " elements");
      EXPECT_TRUE(same_bits(mine[i], theirs[i]));
      const std::vector<at::Tensor> a = optimizer_state(*fused, mine[i]), b = optimizer_state(*reference, theirs[i]);
      ASSERT_EQ(a.size(), 3u);
      for (size_t k = 1; k < 3; ++k) {
        EXPECT_EQ(a[k].scalar_type(), narrow ? at::kBFloat16 : at::kFloat);
        EXPECT_TRUE(same_bits(a[k], narrow ? b[k].to(at::kBFloat16) : b[k])) << "moment " << k;
      }
    }
  }
}

// On a GPU (libtorch >= 2.4), AdamW steps in ATen's multi-tensor kernel: within rounding of
// torch::optim's sequence (its arithmetic is fp32 with fewer roundings), the clipping coefficient
// applied as it reads the gradients, the same bits when run again (what a memory policy's bit
// identity rests on), moments kept in the parameter's type. bf16 moments (another type than the
// parameter's) take torch::optim's kernels, as before.
TEST(FusedOptimizer, OnAGpuAdamWIsAtensMultiTensorKernelWithinRoundingAndRepeatsItsBits) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no GPU here";
  const at::Device gpu(at::kCUDA);
  const std::vector<at::Tensor> start = parameters(at::kFloat);
  std::vector<at::Tensor> mine = on_gpu(start), again = on_gpu(start), theirs = on_gpu(start);
  std::unique_ptr<torch::optim::Optimizer> fused = adamw(0.1, true)(mine), twice = adamw(0.1, true)(again),
                                           reference = adamw(0.1, false)(theirs);
  const double scale = 0.37;
  for (int step = 0; step < 4; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    at::manual_seed(300 + step);
    for (auto* o : {fused.get(), twice.get(), reference.get()}) set_learning_rate(*o, 0.01 * (step + 1));
    for (size_t i = 0; i < mine.size(); ++i) {
      const at::Tensor g = at::randn(start[i].sizes()).to(gpu) * (step % 2 == 0 ? 1e-3 : 5.0);
      mine[i].mutable_grad() = g.clone();
      again[i].mutable_grad() = g.clone();
      theirs[i].mutable_grad() = g * scale;
    }
    dynamic_cast<FusedStep&>(*fused).set_gradient_scale(scale);
    // The coefficient as the trainer's step leaves it, on the device (never read by the host).
    dynamic_cast<FusedStep&>(*twice).set_gradient_scale(at::scalar_tensor(scale, at::kDouble).to(gpu));
    fused->step();
    twice->step();
    reference->step();
    for (size_t i = 0; i < mine.size(); ++i) {
      SCOPED_TRACE("parameter of " + std::to_string(mine[i].numel()) + " elements");
      EXPECT_TRUE(mine[i].equal(again[i])) << "the same bits when run again, the coefficient a number or on the device";
      EXPECT_TRUE(at::allclose(mine[i], theirs[i], /*rtol=*/1e-5, /*atol=*/1e-6))
          << "largest difference " << (mine[i] - theirs[i]).abs().max().item<double>();
      const std::vector<at::Tensor> a = optimizer_state(*fused, mine[i]), b = optimizer_state(*reference, theirs[i]);
      ASSERT_EQ(a.size(), 3u);
      EXPECT_EQ(a[0].item<int64_t>(), step + 1);
      for (size_t k = 1; k < 3; ++k) {
        EXPECT_EQ(a[k].device(), mine[i].device());
        EXPECT_EQ(a[k].scalar_type(), at::kFloat);
        EXPECT_TRUE(at::allclose(a[k], b[k], 1e-5, 1e-6)) << "moment " << k;
      }
    }
  }
  // bf16 gradients (training.gradient_dtype = "bf16"): widened for the kernel, the same bits as
  // the kernel on the widened values.
  {
    for (size_t i = 0; i < mine.size(); ++i) {
      const at::Tensor g = at::randn(start[i].sizes()).to(gpu).to(at::kBFloat16);
      mine[i].mutable_grad() = g.clone();
      again[i].mutable_grad() = g.to(at::kFloat);
    }
    dynamic_cast<FusedStep&>(*fused).set_gradient_scale(scale);
    dynamic_cast<FusedStep&>(*twice).set_gradient_scale(scale);
    fused->step();
    twice->step();
    for (size_t i = 0; i < mine.size(); ++i) EXPECT_TRUE(mine[i].equal(again[i])) << "bf16 gradient " << i;
  }
  // bf16 moments: torch::optim's kernels on widened copies, rounded back.
  auto& f = dynamic_cast<FusedAdamW&>(*fused);
  f.set_state_dtype(at::kBFloat16);
  for (at::Tensor& p : mine) p.mutable_grad() = at::ones_like(p);
  f.step();
  EXPECT_EQ(optimizer_state(f, mine[2])[1].scalar_type(), at::kBFloat16);
}

TEST(FusedOptimizer, ACoefficientLeftOnTheDeviceScalesAsTheNumberDoes) {
  // GradientScale's tensor path (a GPU's, taken here on the CPU too): fp32 and fp64 gradients
  // multiplied in place as by the number, bit for bit; 16-bit ones in fp32 arithmetic, rounded once, as
  // ATen's CUDA kernels multiply them by a number (its CPU kernels in libtorch 1.13 do not: they
  // never see a coefficient on the device). On a GPU, every type as by the number there.
  at::manual_seed(11);
  std::vector<at::Device> devices{at::kCPU};
  if (at::hasCUDA()) devices.emplace_back(at::kCUDA);
  for (const at::Device device : devices) {
    for (const double c : {0.37, 1.0 / 3.0, 1e-7, 1.0}) {
      const GradientScale on_device{1.0, at::scalar_tensor(c, at::kDouble).to(device)};
      for (const at::ScalarType type : {at::kFloat, at::kBFloat16, at::kHalf, at::kDouble}) {
        const at::Tensor g = (at::randn({257}) * 40).to(type).to(device);
        const bool narrow = type == at::kBFloat16 || type == at::kHalf;
        const at::Tensor expected =
            narrow && device.is_cpu() ? (g.to(at::kFloat) * static_cast<float>(c)).to(type) : g * c;
        at::Tensor scaled = g.clone();
        const at::Tensor mine = on_device.applied_to(scaled);
        EXPECT_EQ(mine.scalar_type(), type);
        EXPECT_TRUE(mine.equal(expected)) << "coefficient " << c << ", " << type << " on " << device;
        EXPECT_TRUE(scaled.equal(expected)) << "in place: no gradient-sized temporary";
      }
    }
  }
  EXPECT_TRUE(GradientScale{}.is_one());
  EXPECT_FALSE((GradientScale{1.0, at::scalar_tensor(1.0, at::kDouble)}.is_one())) << "the host does not read it";
}

TEST(FusedOptimizer, OnAGpuSgdIsAtensMultiTensorKernelWithinRoundingAndRepeatsItsBits) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no GPU here";
  const at::Device gpu(at::kCUDA);
  for (const double momentum : {0.0, 0.9}) {
    SCOPED_TRACE("momentum " + std::to_string(momentum));
    const std::vector<at::Tensor> start = parameters(at::kFloat);
    std::vector<at::Tensor> mine = on_gpu(start), again = on_gpu(start), theirs = on_gpu(start);
    std::unique_ptr<torch::optim::Optimizer> fused = sgd(momentum, 0.01, true)(mine),
                                             twice = sgd(momentum, 0.01, true)(again),
                                             reference = sgd(momentum, 0.01, false)(theirs);
    const double scale = 0.37;
    for (int step = 0; step < 4; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      at::manual_seed(400 + step);
      for (auto* o : {fused.get(), twice.get(), reference.get()}) set_learning_rate(*o, 0.01 * (step + 1));
      for (size_t i = 0; i < mine.size(); ++i) {
        const at::Tensor g = at::randn(start[i].sizes()).to(gpu) * (step % 2 == 0 ? 1e-3 : 5.0);
        mine[i].mutable_grad() = g.clone();
        again[i].mutable_grad() = g.clone();
        theirs[i].mutable_grad() = g * scale;
      }
      dynamic_cast<FusedStep&>(*fused).set_gradient_scale(scale);
      dynamic_cast<FusedStep&>(*twice).set_gradient_scale(at::scalar_tensor(scale, at::kDouble).to(gpu));
      fused->step();
      twice->step();
      reference->step();
      for (size_t i = 0; i < mine.size(); ++i) {
        SCOPED_TRACE("parameter of " + std::to_string(mine[i].numel()) + " elements");
        EXPECT_TRUE(mine[i].equal(again[i])) << "the same bits when run again, the coefficient a number or on the device";
        EXPECT_TRUE(at::allclose(mine[i], theirs[i], /*rtol=*/1e-5, /*atol=*/1e-6))
            << "largest difference " << (mine[i] - theirs[i]).abs().max().item<double>();
        const std::vector<at::Tensor> a = optimizer_state(*fused, mine[i]), b = optimizer_state(*reference, theirs[i]);
        ASSERT_EQ(a.size(), b.size());
        for (size_t k = 0; k < a.size(); ++k) {
          EXPECT_EQ(a[k].device(), mine[i].device());
          EXPECT_TRUE(at::allclose(a[k], b[k], 1e-5, 1e-6)) << "momentum buffer";
        }
      }
    }
  }
}

// What the trainer builds is the fused kind; its state reads back and is copied to host as
// torch::optim's is (checkpoints: training/optimizer.h).
TEST(FusedOptimizer, TheTrainersOptimizerIsFusedAndItsStateIsTorchOptims) {
  std::vector<at::Tensor> params = parameters(at::kFloat);
  OptimizerOptions o;
  o.kind = OptimizerKind::kAdamw;
  std::unique_ptr<torch::optim::Optimizer> optimizer = make_optimizer(o, params);
  EXPECT_NE(dynamic_cast<FusedAdamW*>(optimizer.get()), nullptr);
  EXPECT_EQ(optimizer_name(*optimizer), "adamw");
  for (at::Tensor& p : params) p.mutable_grad() = at::ones_like(p);
  optimizer->step();
  const std::vector<at::Tensor> state = optimizer_state(*optimizer, params[2]);
  ASSERT_EQ(state.size(), 3u);
  EXPECT_EQ(state[0].item<int64_t>(), 1);
  const std::unique_ptr<torch::optim::Optimizer> copy = host_copy_of(*optimizer);
  EXPECT_EQ(optimizer_name(*copy), "adamw");
  o.kind = OptimizerKind::kSgd;
  EXPECT_NE(dynamic_cast<FusedSgd*>(make_optimizer(o, params).get()), nullptr);
}

}  // namespace
}  // namespace ht::test

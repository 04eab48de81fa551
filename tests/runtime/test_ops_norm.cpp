// batch_norm, layer_norm and rms_norm: forward, gradients and running statistics equal libtorch (float64).
#include "tests/support/op_check.h"

namespace ht::test {
namespace {

TEST(OpsNorm, BatchNormTrainingUpdatesRunningStatsOnce) {
  at::manual_seed(0);
  const at::Tensor x = rnd({4, 3, 5, 5}), w = rnd({3}), b = rnd({3});
  for (const at::Device& dev : test_devices()) {
    const auto opts = at::TensorOptions().dtype(at::kDouble).device(dev);
    at::Tensor rm = at::zeros({3}, opts), rv = at::ones({3}, opts);
    at::Tensor rm_ref = rm.clone(), rv_ref = rv.clone();
    check_op({{x, w, b},
              [&](auto&, auto& t) { return one(batch_norm(t[0], t[1], t[2], rm, rv, true, 0.1, 1e-5)); },
              [&](auto& t) {
                return one(at::batch_norm(t[0], t[1], t[2], rm_ref, rv_ref, true, 0.1, 1e-5, false));
              }},
             dev);
    EXPECT_TRUE(all_close(rm, rm_ref)) << "running mean";
    EXPECT_TRUE(all_close(rv, rv_ref)) << "running var";
  }
}

TEST(OpsNorm, BatchNormEvaluationUsesRunningStats) {
  at::manual_seed(1);
  const at::Tensor x = rnd({4, 3, 2, 2}), w = rnd({3}), b = rnd({3});
  const at::Tensor rm = rnd({3}), rv = rnd({3}).abs() + 0.5;
  for (const at::Device& dev : test_devices()) {
    const at::Tensor drm = rm.to(dev), drv = rv.to(dev);
    check_op({{x, w, b},
              [&](auto&, auto& t) { return one(batch_norm(t[0], t[1], t[2], drm, drv, false, 0.1, 1e-5)); },
              [&](auto& t) {
                return one(at::batch_norm(t[0], t[1], t[2], drm, drv, false, 0.1, 1e-5, false));
              }},
             dev);
    EXPECT_TRUE(all_close(drm.cpu(), rm, 0, 0)) << "evaluation must not touch running stats";
  }
}

TEST(OpsNorm, BatchNorm1dInput) {
  at::manual_seed(2);
  check_op({{rnd({6, 4}), rnd({4}), rnd({4})},
            [](auto&, auto& t) { return one(batch_norm(t[0], t[1], t[2], {}, {}, true, 0.1, 1e-5)); },
            [](auto& t) { return one(at::batch_norm(t[0], t[1], t[2], {}, {}, true, 0.1, 1e-5, false)); }});
}

TEST(OpsNorm, LayerNorm) {
  at::manual_seed(3);
  check_op({{rnd({2, 5, 8}), rnd({8}), rnd({8})},
            [](auto&, auto& t) { return one(layer_norm(t[0], {8}, t[1], t[2], 1e-5)); },
            [](auto& t) { return one(at::layer_norm(t[0], {8}, t[1], t[2], 1e-5)); }});
  check_op({{rnd({3, 4, 6}), rnd({4, 6}), rnd({4, 6})},
            [](auto&, auto& t) { return one(layer_norm(t[0], {4, 6}, t[1], t[2], 1e-5)); },
            [](auto& t) { return one(at::layer_norm(t[0], {4, 6}, t[1], t[2], 1e-5)); }});
}

// The reference is Llama's definition written out: x * rsqrt(mean(x^2) + eps) * w.
TEST(OpsNorm, RmsNormIsLlamasDefinition) {
  at::manual_seed(4);
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{2, 5, 8}, std::vector<int64_t>{7, 3}}) {
    const int64_t d = shape.back();
    check_op({{rnd(shape), rnd({d})},
              [](auto&, auto& t) { return one(rms_norm(t[0], t[1], 1e-5)); },
              [](auto& t) { return one(t[0] * at::rsqrt(t[0].pow(2).mean(-1, true) + 1e-5) * t[1]); }});
  }
}

TEST(OpsNorm, RmsNormRefusesAWeightOfTheWrongWidth) {
  Interpreter interp;
  const Tensor x = interp.input(at::ones({2, 4})), w = interp.param(at::ones({3}));
  EXPECT_THROW(rms_norm(x, w, 1e-5), c10::Error);
}

}  // namespace
}  // namespace ht::test

#include "training/loss_scaler.h"

#include <ATen/ATen.h>

namespace ht {

LossScaler::LossScaler(LossScalerOptions options) : options_(options) {
  TORCH_CHECK(options_.initial_scale > 0 && options_.growth_factor >= 1 && options_.backoff_factor > 0 &&
                  options_.backoff_factor < 1 && options_.growth_interval > 0,
              "LossScaler: scale > 0, growth >= 1, 0 < backoff < 1 and interval > 0 expected");
  state_.scale = options_.initial_scale;
}

bool LossScaler::unscale(const std::vector<at::Tensor>& params) const {
  at::NoGradGuard no_grad;
  const double inverse = 1.0 / state_.scale;  // exact for the powers of two scales normally are
  std::vector<at::Tensor> finite;
  for (const at::Tensor& p : params) {
    if (!p.grad().defined()) continue;
    at::Tensor g = p.grad();
    g.mul_(inverse);
    finite.push_back(at::isfinite(g).all());
  }
  if (finite.empty()) return true;
  return at::stack(finite).all().item<bool>();
}

void LossScaler::update(bool finite) {
  if (!finite) {
    state_.scale *= options_.backoff_factor;
    state_.good_steps = 0;
    ++state_.skipped_steps;
    return;
  }
  if (++state_.good_steps >= options_.growth_interval) {
    state_.scale *= options_.growth_factor;
    state_.good_steps = 0;
  }
}

}  // namespace ht

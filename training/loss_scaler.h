#pragma once
// Dynamic loss scaling for fp16 training (PyTorch's GradScaler, as a plain class): the loss is
// multiplied by `scale` before backward so that small gradients survive fp16's range; before the
// optimizer step the gradients are divided by it again and checked. A step with an inf or NaN
// gradient is skipped and the scale backs off; after `growth_interval` good steps in a row it
// grows. bf16 has fp32's exponent range and needs none of this.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace ht {

struct LossScalerOptions {
  double initial_scale = 65536.0;  // 2^16, as PyTorch
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

// What a checkpoint keeps, so that a resumed run scales exactly as an uninterrupted one.
struct LossScalerState {
  double scale = 65536.0;
  int64_t good_steps = 0;     // finite steps since the last change of scale
  int64_t skipped_steps = 0;  // over the whole run
};

class LossScaler {
 public:
  explicit LossScaler(LossScalerOptions options = {});

  double scale() const { return state_.scale; }
  int64_t skipped_steps() const { return state_.skipped_steps; }
  const LossScalerState& state() const { return state_; }
  void restore(const LossScalerState& state) { state_ = state; }

  // Divides every defined gradient of `params` by the scale, in place, and returns whether all of
  // them are finite (one device synchronization for the whole model).
  bool unscale(const std::vector<at::Tensor>& params) const;
  // After the step: `finite` false counts a skipped step and backs off; true counts towards growth.
  void update(bool finite);

 private:
  LossScalerOptions options_;
  LossScalerState state_;
};

}  // namespace ht

#include "training/batches.h"

#include <utility>

namespace ht {

Batches::Batches(const Dataset& train, Sampler& sampler, const ContextLayout& context, at::Device device, bool ahead)
    : train_(train), sampler_(sampler), context_(context), device_(device), ahead_allowed_(ahead) {}

Batch Batches::draw() { return staged_for(context_part(train_.batch(sampler_.next()), context_), device_); }

Batch Batches::take() {
  if (!ahead_) return draw();
  Batch batch = std::move(*ahead_);
  ahead_.reset();
  return batch;
}

void Batches::draw_ahead() {
  if (!ahead_allowed_ || ahead_) return;
  before_ahead_ = sampler_.position();
  ahead_ = draw();
}

SamplerPosition Batches::position() const { return ahead_ ? before_ahead_ : sampler_.position(); }

void Batches::seek(SamplerPosition position) {
  ahead_.reset();
  sampler_.seek(position);
}

}  // namespace ht

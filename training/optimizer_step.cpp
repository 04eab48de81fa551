#include "training/optimizer_step.h"

#include "training/compact.h"

namespace ht {

void ShardedUpdate::attach() {
  if (gradient_shards_) {
    shard_->attach_gradients(*gradient_shards_);  // this rank's share of the averaged gradients
  } else {
    shard_->attach_gradients();  // this rank's pieces of the averaged gradients
  }
}

void ShardedUpdate::finish(bool stepped) {
  shard_->detach_gradients();
  if (parameter_shards_) {
    // Sharded parameters: the next forward gathers the updated shards; this step's gathers.
    const ParameterGatherStats g = parameter_shards_->take_stats();
    stats_ = ShardStats{g.ms, g.bytes, g.drops, g.hidden()};
    return;
  }
  if (stepped) shard_->gather_parameters();  // a skipped step changed no piece on any rank
  stats_ = stepped ? shard_->stats() : ShardStats{};
}

void ShardedUpdate::record(JsonObject& record) const {
  record.add("shard_elements", shard_->elements()).add("gather_ms", stats_.gather_ms)
      .add("gather_bytes", stats_.gather_bytes);
  if (parameter_shards_) record.add("parameter_drops", stats_.drops).add("gather_hidden", stats_.gather_hidden);
}

void CompactedState::before_step(torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& master) {
  if (!offload_) return;
  before_ = offload_->stats();
  offload_->to_device(optimizer, master, device_);
}

void CompactedState::after_step(torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& master) {
  if (!compacted_) compacted_ = compact_optimizer_state(optimizer, master);
  if (!offload_) return;
  offload_->to_host(optimizer, master);
  const StateOffloadStats& s = offload_->stats();
  step_ = {s.bytes_out - before_.bytes_out, s.bytes_in - before_.bytes_in, s.wait_ms - before_.wait_ms};
}

void CompactedState::record(JsonObject& record) const {
  if (!offload_) return;
  record.add("state_out_bytes", step_.bytes_out).add("state_in_bytes", step_.bytes_in)
      .add("state_wait_ms", step_.wait_ms);
}

StepOutcome OptimizerStep::step(double lr) {
  p_.state->before_step(*p_.optimizer, p_.master);
  p_.shard->attach();
  const StepOutcome outcome = optimizer_step(*p_.optimizer, p_.checked, options_, lr, p_.scaler.get(), p_.checks);
  p_.shard->finish(outcome.stepped);
  clear_grads(p_.params);
  weights_changed();
  p_.state->after_step(*p_.optimizer, p_.master);
  return outcome;
}

std::optional<LossScalerState> OptimizerStep::scaler_state() const {
  if (!p_.scaler) return std::nullopt;
  return p_.scaler->state();
}

void OptimizerStep::restore(const std::optional<LossScalerState>& state) {
  if (p_.scaler && state) p_.scaler->restore(*state);
}

void OptimizerStep::record(JsonObject& record) const {
  p_.state->record(record);
  p_.shard->record(record);
  if (p_.scaler) record.add("loss_scale", p_.scaler->scale()).add("skipped_steps", p_.scaler->skipped_steps());
  if (p_.copies) {
    record.add("weight_copies_bytes", p_.copies->bytes())
        .add("weight_copies_made", p_.copies->made_last_step());
  }
}

}  // namespace ht

#include "launcher/training/trainer.h"

#include "launcher/training/compact.h"
#include "launcher/training/optimizer.h"
#include "alloc/cpu_device_allocator.h"

#include <algorithm>
#include <cmath>

// The trainer's model state: where the parameters live (one block; in the all-reduce's order when
// sharded), the sharded optimizer, and checkpoints (written and resumed in the one unsharded
// layout whatever the ranks, stages or sharding).

namespace ht {

void Trainer::compact_parameters(bool in_reduction_order) {
  // launcher/training/compact.h: the parameters and buffers in one block per dtype at the arena's
  // top, before the gradient block goes below them. (set_data keeps each parameter's identity: the optimizer's
  // state, the gradient slots and tied uses all key on it.)
  std::vector<at::Tensor> state = in_reduction_order ? replicas_.reduction_order() : params_;
  for (const at::Tensor& p : params_) {  // any the reduction leaves out (no gradient) after them
    if (std::none_of(state.begin(), state.end(), [&](const at::Tensor& t) { return t.is_same(p); })) state.push_back(p);
  }
  for (const at::Tensor& b : model_->buffers()) state.push_back(b);  // batch norm's statistics: among them
  std::vector<at::Tensor> moving;
  for (const at::Tensor& t : state) {
    if (t.numel() > 0 && t.is_non_overlapping_and_dense() && (!arena_ || arena_->contains(t.data_ptr()))) {
      moving.push_back(t);
    }
  }
  if (moving.empty()) return;
  const std::vector<at::Tensor> host = copies_on_host(moving);
  for (size_t i = 0; i < moving.size(); ++i) moving[i].set_data(host[i]);
  // Sharding needs each bucket's parameters in one piece: one block or none.
  const std::vector<at::Tensor> placed = in_reduction_order ? into_one_block(host, device_) : back_on_device(host, device_);
  for (size_t i = 0; i < moving.size(); ++i) moving[i].set_data(placed[i]);
}

void Trainer::shard_parameters() {
  param_shards_ = std::make_unique<ParameterShards>(replicas_.shared_group(), params_, replicas_.buckets(), device_);
  interp_.set_parameter_source(param_shards_.get());
  // Under a budget with eviction the memory manager decides which gathered buckets to drop;
  // otherwise gathers run ahead on a thread that owns the group's collectives while a step runs.
  const bool managed = arena_ != nullptr && evicts(config_.memory.policy);
  param_shards_->set_managed(managed);
  if (!managed && config_.parallel.prefetch > 0 && replicas_.group().allows_worker_thread()) {
    collectives_ = std::make_shared<CollectiveWorker>(replicas_.shared_group());
    param_shards_->set_prefetch(collectives_, static_cast<int>(config_.parallel.prefetch));
  }
  param_shards_->set_block_uses(model_->parameters_read_by_blocks());
  model_->set_block_listener([this](int block) {
    interp_.set_block(block);  // tape entries record it: backward prefetches by block
    param_shards_->block_begins(block);
  });
  // The rest (buffers, parameters no bucket holds) as compact_parameters places them: one block.
  const std::vector<at::Tensor> sharded = replicas_.reduction_order();
  std::vector<at::Tensor> rest;
  for (const at::Tensor& p : params_) {
    if (std::none_of(sharded.begin(), sharded.end(), [&](const at::Tensor& t) { return t.is_same(p); })) rest.push_back(p);
  }
  for (const at::Tensor& b : model_->buffers()) rest.push_back(b);
  std::vector<at::Tensor> moving;
  for (const at::Tensor& t : rest) {
    if (t.numel() > 0 && t.is_non_overlapping_and_dense()) moving.push_back(t);
  }
  if (moving.empty()) return;
  const std::vector<at::Tensor> host = copies_on_host(moving);
  for (size_t i = 0; i < moving.size(); ++i) moving[i].set_data(host[i]);
  const std::vector<at::Tensor> placed = back_on_device(host, device_);
  for (size_t i = 0; i < moving.size(); ++i) moving[i].set_data(placed[i]);
}

void Trainer::set_up_sharding() {
  shard_ = std::make_unique<OptimizerShard>(replicas_.shared_group(), params_, replicas_.buckets(), gradients_.get(),
                                            param_shards_ ? &param_shards_->shards() : nullptr);
  // The optimizer of this rank's pieces replaces the one over every parameter.
  optimizer_ = make_optimizer(config_.training, shard_->pieces());
}

StepAcrossStages Trainer::shard_step_hooks() {
  StepAcrossStages hooks;
  hooks.gradient_norm = [this] {
    const at::Tensor norms = gradient_norms(shard_->pieces());
    at::Tensor squares = at::full({1}, norms.numel() > 0 ? norms.square().sum().item<double>() : 0.0, at::kDouble);
    replicas_.group().allreduce_sum(squares, "the gradient norm");
    return std::sqrt(squares.item<double>());
  };
  hooks.all_finite = [this](bool finite) {
    at::Tensor not_finite = at::full({1}, finite ? 0.0 : 1.0, at::kDouble);  // ranks that saw inf or NaN
    replicas_.group().allreduce_sum(not_finite, "the finite check");
    return not_finite.item<double>() == 0.0;
  };
  return hooks;
}

void Trainer::resume_from(const std::string& folder) {
  if (pipeline_) {
    // The checkpoint holds the whole model; a stage keeps its own share of it.
    with_full_model(*pipeline_, *model_, *optimizer_,
                               [&] { state_ = CheckpointStore::load(folder, *model_, *optimizer_); });
  } else if (shard_) {
    // The checkpoint holds the whole state, whatever the number of ranks that wrote it.
    const std::unique_ptr<torch::optim::Optimizer> full = make_optimizer(config_.training, params_);
    if (param_shards_) {
      HostAllocationScope host;  // the whole parameters only while each rank takes its share
      param_shards_->gather_all(interp_.memory_hooks());
    }
    state_ = CheckpointStore::load(folder, *model_, *full);
    shard_->take_state(*full, *optimizer_);
    if (param_shards_) {
      replicas_.broadcast_state(model_->buffers());  // while the parameters are whole
      param_shards_->take_from_whole();
      param_shards_->release_all();
    }
  } else {
    state_ = CheckpointStore::load(folder, *model_, *optimizer_);
  }
  sampler_.seek(state_.sampler);
  interp_.set_seed_counter(state_.seed_counter);
  if (scaler_ && state_.loss_scaler) scaler_->restore(*state_.loss_scaler);
  if (!param_shards_) replicas_.broadcast_state(model_->buffers());  // every rank read the same files; make sure
  result_.resumed_from_step = state_.step;
  progress_.line("resumed from " + folder + " at step " + std::to_string(state_.step));
}

void Trainer::save_checkpoint() {
  HostAllocationScope host;  // serialization buffers are host memory, not the device's
  if (shard_) {
    save_sharded_checkpoint();
    return;
  }
  if (replicas_.rank() != 0) return;  // the replicas hold the same state: rank 0 writes it
  if (pipeline_) {
    // Every stage's first replica takes part; rank 0 writes the whole model.
    std::string folder;
    with_full_model(*pipeline_, *model_, *optimizer_, [&] {
      gather_to_first_stage(*pipeline_, *model_, *optimizer_);
      if (pipeline_->rank() == 0) folder = checkpoints_.save(*model_, *optimizer_, state_);
    });
    if (!folder.empty()) progress_.line("checkpoint " + folder);
    return;
  }
  const std::string folder = checkpoints_.save(*model_, *optimizer_, state_);
  progress_.line("checkpoint " + folder);
}

void Trainer::save_sharded_checkpoint() {
  // Every replica takes part: the state is gathered into one unsharded optimizer (on the host),
  // which rank 0 writes in the one layout every run reads.
  replicas_.group().set_context("the checkpoint after step " + std::to_string(state_.step));
  const std::unique_ptr<torch::optim::Optimizer> full = make_optimizer(config_.training, params_);
  shard_->gather_state(*optimizer_, *full);
  // Sharded parameters: gathered whole on the host (this function's scope) to be written.
  if (param_shards_) param_shards_->gather_all(interp_.memory_hooks());
  struct Release {
    ParameterShards* shards;
    ~Release() {
      if (shards) shards->release_all();
    }
  } release{param_shards_.get()};
  if (replicas_.rank() != 0) return;
  const std::string folder = checkpoints_.save(*model_, *full, state_);
  progress_.line("checkpoint " + folder);
}

}  // namespace ht

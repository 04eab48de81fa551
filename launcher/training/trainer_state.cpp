#include "launcher/training/trainer.h"

#include "launcher/training/compact.h"
#include "launcher/training/optimizer.h"
#include "launcher/training/pipeline_setup.h"
#include "launcher/user_error.h"
#include "parallel/grid_group.h"
#include "alloc/byte_size.h"
#include "alloc/cpu_device_allocator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <set>

// The trainer's model state: where the parameters live (one block; in the all-reduce's order when
// sharded), the sharded optimizer, and checkpoints (whole, or a sharded run's slices; either
// resumes at any count of ranks, stages or sharding).

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
  // Not beside a tensor-parallel group, whose collectives use MPI on the computing thread.
  if (!managed && config_.parallel.prefetch > 0 && replicas_.group().allows_worker_thread() && !tensor_) {
    collectives_ = std::make_shared<CollectiveWorker>(replicas_.shared_group());
    param_shards_->set_prefetch(collectives_, static_cast<int>(config_.parallel.prefetch));
  }
  param_shards_->set_block_uses(model_->parameters_read_by_blocks());
  model_->set_block_listener([this](int block) {
    interp_.set_block(block);  // tape entries record it: backward prefetches by block
    param_shards_->block_begins(block);
    memory_.block_begins(block);  // memory.policy = "full" drops the block before
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

// Sharded gradients: each bucket's reduce-scatter runs on a worker thread while backward goes on
// (parallel.overlap), on sharded parameters' prefetch worker where it exists (it owns the group
// then), else on one of its own. Not where the group takes no second thread, nor where ZeRO-3's
// gathers run on this thread (no prefetch: under a budget with eviction, or parallel.prefetch =
// 0), nor in a CUDA budget's arena (NCCL's padded path allocates its temporaries on the thread
// that calls it).
void Trainer::overlap_reduce_scatters() {
  const bool overlap = config_.parallel.overlap && !(arena_ && device_.is_cuda());
  if (!collectives_ && overlap && !param_shards_ && replicas_.group().allows_worker_thread() && !tensor_) {
    collectives_ = std::make_shared<CollectiveWorker>(replicas_.shared_group());
  }
  if (collectives_) grad_shards_->set_worker(collectives_);  // the thread that owns the group while a step runs
  grad_shards_->set_overlap(overlap);  // without a worker, no effect
}

void Trainer::set_up_sharding() {
  // DataParallel's parameters, which its buckets index: a pipeline stage's own.
  shard_ = std::make_unique<OptimizerShard>(replicas_.shared_group(), replicas_.parameters(), replicas_.buckets(),
                                            gradients_.get(),
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
  if ((shard_ || tensor_) && SliceIndex::present(folder)) {
    resume_from_slices(folder);  // each rank reads only what its stage, part and pieces hold
  } else if (tensor_) {
    if (pipeline_ || shard_) {
      throw UserError(folder + ": a whole checkpoint (model.pt, from a run without sharding or tensor parallelism) "
                      "resumes into tensor-parallel " + std::string(pipeline_ ? "pipeline stages" : "sharded replicas") +
                      " only through slices: resume it first at parallel.tensor_parallel = " +
                      std::to_string(tensor_->size()) + " without pipeline stages or sharding (that run's checkpoints "
                      "are slices) and then from its checkpoint here, or here at parallel.tensor_parallel = 1");
    }
    // Whole tensors, whatever the layout that wrote them: each rank keeps its parts.
    with_whole_tensors([&] { state_ = CheckpointStore::load(folder, *model_, *optimizer_); });
  } else if (pipeline_ && shard_) {
    // A whole checkpoint: the stage's whole state from it, then this rank's share of that.
    const std::unique_ptr<torch::optim::Optimizer> full = make_optimizer(config_.training, params_);
    with_full_model(*pipeline_, *model_, *full, [&] { state_ = CheckpointStore::load(folder, *model_, *full); });
    shard_->take_state(*full, *optimizer_);
  } else if (pipeline_) {
    // The checkpoint holds the whole model; a stage keeps its own share of it.
    with_full_model(*pipeline_, *model_, *optimizer_,
                               [&] { state_ = CheckpointStore::load(folder, *model_, *optimizer_); });
  } else if (shard_) {
    // A checkpoint of the whole state (an unsharded run's), whatever the number of ranks that wrote it.
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
  // Every rank read the same files; make sure (sharded parameters have nothing whole to send).
  if (!param_shards_) replicas_.broadcast_state(model_->buffers());
  result_.resumed_from_step = state_.step;
  progress_.line("resumed from " + folder + " at step " + std::to_string(state_.step));
}

void Trainer::save_checkpoint() {
  HostAllocationScope host;  // serialization buffers are host memory, not the device's
  if (shard_ || tensor_) {
    save_sliced_checkpoint();  // every rank writes what it holds
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

}  // namespace ht

#pragma once
// The optimizer step: one part of the trainer (training/trainer_parts.h) that owns what the step
// updates and how: the optimizer (torch::optim) over the master tensors (the parameters, or this
// rank's pieces of them under ZeRO), its state and where that waits between steps, the gradients'
// checks (fp16's loss scaler, the global norm across the ranks that hold parts of it), and ZeRO's
// sharded update (each rank steps its pieces and the updated ones go to every rank). The next
// issue (16-bit weights, fp32 master weights, one fused pass) changes the precision layout here.
//
// A step: the state comes to the device (if it waits on host), the pieces take their gradients,
// the gradients are unscaled and checked (fp16), clipped to the global norm and stepped at the
// scheduled rate; then the pieces are gathered, the gradients cleared, the state compacted once
// (under a budget) and sent back to host.

#include "alloc/weight_copies.h"
#include "base/json.h"
#include "parallel/parameter_shards.h"
#include "training/loss_scaler.h"
#include "training/optimizer.h"
#include "training/optimizer_shard.h"
#include "training/state_offload.h"

#include <torch/optim/optimizer.h>

#include <memory>
#include <optional>
#include <vector>

namespace ht {

// ZeRO's share of a step: before it the pieces take their gradients; after it, the updated
// pieces reach every rank. The base class is the unsharded step: nothing to do.
class ShardUpdate {
 public:
  virtual ~ShardUpdate() = default;
  virtual void attach() {}
  virtual void finish(bool stepped) {}
  virtual void record(JsonObject& record) const {}
  // The shard whose pieces the optimizer steps; null unsharded.
  virtual OptimizerShard* shard() { return nullptr; }
};

// ZeRO-1, ZeRO-2 and ZeRO-3 over `shard`: the pieces' gradients come from the whole averaged
// gradients (`gradient_shards` null) or from this rank's share of the sums (ZeRO-2/3); after the
// step the updated pieces are all-gathered (ZeRO-1/2), or the next forward gathers them (ZeRO-3,
// `parameter_shards`).
class ShardedUpdate final : public ShardUpdate {
 public:
  ShardedUpdate(std::unique_ptr<OptimizerShard> shard, std::shared_ptr<const GradientShards> gradient_shards,
                std::shared_ptr<ParameterShards> parameter_shards)
      : shard_(std::move(shard)), gradient_shards_(std::move(gradient_shards)),
        parameter_shards_(std::move(parameter_shards)) {}
  void attach() override;
  void finish(bool stepped) override;
  void record(JsonObject& record) const override;
  OptimizerShard* shard() override { return shard_.get(); }

 private:
  std::unique_ptr<OptimizerShard> shard_;
  std::shared_ptr<const GradientShards> gradient_shards_;  // null: whole gradients (ZeRO-1)
  std::shared_ptr<ParameterShards> parameter_shards_;
  ShardStats stats_;
};

// Where the optimizer state waits between steps. The base class: on the device, as made.
class StatePlacement {
 public:
  virtual ~StatePlacement() = default;
  virtual void before_step(torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& master) {}
  virtual void after_step(torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& master) {}
  virtual void record(JsonObject& record) const {}
};

// Under a budget: the state, made lazily among the first step's temporaries, moved into one block
// at the arena's top once it exists (training/compact.h); with `offload`, then sent to host memory
// after each step and brought back before the next (memory.optimizer_state = "host").
class CompactedState : public StatePlacement {
 public:
  explicit CompactedState(std::unique_ptr<StateOffload> offload = nullptr) : offload_(std::move(offload)) {}
  void before_step(torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& master) override;
  void after_step(torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& master) override;
  void record(JsonObject& record) const override;
  void set_device(const at::Device& device) { device_ = device; }

 private:
  std::unique_ptr<StateOffload> offload_;
  at::Device device_ = at::kCPU;
  bool compacted_ = false;
  StateOffloadStats before_, step_;
};

struct OptimizerStepParts {
  std::unique_ptr<torch::optim::Optimizer> optimizer;  // over `master`
  std::vector<at::Tensor> params;   // the model's: their gradients are cleared after each step
  std::vector<at::Tensor> master;   // what the optimizer keeps state for: `params`, or this rank's pieces
  std::vector<at::Tensor> checked;  // whose gradients are unscaled, checked and clipped
  StepAcrossStages checks;          // empty: this rank holds every gradient `checked` counts
  std::unique_ptr<LossScaler> scaler;  // fp16; null otherwise
  std::unique_ptr<ShardUpdate> shard = std::make_unique<ShardUpdate>();
  std::unique_ptr<StatePlacement> state = std::make_unique<StatePlacement>();
  // training.compute_weights = "kept": the weights' 16-bit copies, made again after each step;
  // null: autocast casts at each read.
  std::shared_ptr<ComputeWeights> copies;
};

class OptimizerStep {
 public:
  OptimizerStep(OptimizerOptions options, OptimizerStepParts parts) : options_(options), p_(std::move(parts)) {}

  // What backward's loss is multiplied by (fp16: the scaler's scale; 1 otherwise).
  double loss_scale() const { return p_.scaler ? p_.scaler->scale() : 1.0; }
  // The learning rate of 0-based step `step` of `total`.
  double learning_rate(int64_t step, int64_t total) const { return learning_rate_at(options_, step, total); }
  // Steps at `lr` with the step's gradients in place (combined across the replicas), then clears them.
  StepOutcome step(double lr);
  // The weights changed outside a step (a checkpoint read): their 16-bit copies are made again.
  void weights_changed() {
    if (p_.copies) p_.copies->weights_changed();
  }

  torch::optim::Optimizer& optimizer() { return *p_.optimizer; }
  const std::vector<at::Tensor>& master() const { return p_.master; }
  OptimizerShard* shard() { return p_.shard->shard(); }
  // fp16's scaler as a checkpoint keeps it (nullopt without one), and back from a checkpoint.
  std::optional<LossScalerState> scaler_state() const;
  void restore(const std::optional<LossScalerState>& state);
  // Its fields of a step's metrics record: the state's crossings, the shard's gathers, the scale.
  void record(JsonObject& record) const;

 private:
  OptimizerOptions options_;
  OptimizerStepParts p_;
};

}  // namespace ht

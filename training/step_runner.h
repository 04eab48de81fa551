#pragma once
// The step runner: how a rank's share of one step's batch goes through forward and backward. One
// part of the trainer, chosen once (training/trainer_parts.h): LocalRunner (the whole model on
// this rank, micro-batch after micro-batch) or PipelineRunner (this rank's stage of a pipeline,
// its schedule's actions; parallel/pipeline_stage.h).

#include "base/json.h"
#include "training/dataset.h"
#include "training/engine.h"
#include "training/gradient_sync.h"

#include <cstdint>

namespace ht {

class StepRunner {
 public:
  virtual ~StepRunner() = default;
  // Forward and backward of `batch` (this replica's share of a step: plan.batch.micro_batches
  // micro-batches), each backward seeded with `loss_seed` (1 / micro-batches, times fp16's loss
  // scale); the gradients accumulate in the parameters' slots, and `sync` hears each backward.
  // One step of the memory manager's. Returns the replica's mean loss over its micro-batches, a
  // double on the device, unread: the host reads it once the step's update is queued (reading it
  // here would hold the host until the device finished each micro-batch).
  virtual at::Tensor run(const Batch& batch, double loss_seed, GradientSync& sync) = 0;
  // Evaluation's forward of `n` samples on `interp` (no gradients): the model's output where the
  // loss is computed, undefined on the ranks where it is not.
  virtual Tensor forward_only(Interpreter& interp, const at::Tensor& input, int64_t n) = 0;
  // After a step: its fields of the step's metrics record (a pipeline's per-stage figures, a
  // collective over the stages: every rank calls it). `peak_bytes`: this rank's step peak.
  virtual void step_ended(int64_t peak_bytes) {}
  virtual void record(JsonObject& record) const {}
};

// The whole model on this rank: each micro-batch's forward, loss and backward in turn, each one
// step of the memory manager (the step a static plan captures and runs, memory/static_plan.h).
class LocalRunner final : public StepRunner {
 public:
  LocalRunner(Engine& engine, const BatchPlan& batch) : engine_(engine), batch_(batch) {}
  at::Tensor run(const Batch& batch, double loss_seed, GradientSync& sync) override;
  Tensor forward_only(Interpreter& interp, const at::Tensor& input, int64_t n) override;

 private:
  at::Tensor forward_backward(const Batch& micro, double loss_seed, GradientSync& sync, bool last);
  Engine& engine_;
  BatchPlan batch_;
};

}  // namespace ht

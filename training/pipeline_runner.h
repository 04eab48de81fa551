#pragma once
// The step runner of a pipeline stage (training/step_runner.h): this rank runs its schedule's
// actions over its chunks of the model (parallel/pipeline_stage.h), the whole pipeline step one
// step of the memory manager (its micro-batches interleave). The loss is the last stage's, made
// known to every stage.

#include "parallel/pipeline_stage.h"
#include "training/step_runner.h"

#include <memory>
#include <vector>

namespace ht {

class PipelineRunner final : public StepRunner {
 public:
  PipelineRunner(Engine& engine, const BatchPlan& batch, std::shared_ptr<PipelineStage> stage)
      : engine_(engine), batch_(batch), stage_(std::move(stage)) {}
  at::Tensor run(const Batch& batch, double loss_seed, GradientSync& sync) override;
  Tensor forward_only(Interpreter& interp, const at::Tensor& input, int64_t n) override {
    return stage_->forward_only(interp, input, n);
  }
  // Each stage's compute, waiting, bytes sent and memory peak, gathered (collective).
  void step_ended(int64_t peak_bytes) override;
  void record(JsonObject& record) const override;

 private:
  Engine& engine_;
  BatchPlan batch_;
  std::shared_ptr<PipelineStage> stage_;
  std::vector<double> compute_ms_, wait_ms_, p2p_bytes_, peak_bytes_;  // per stage, the last step's
};

}  // namespace ht

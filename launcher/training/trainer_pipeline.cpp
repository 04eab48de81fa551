// The trainer's pipeline-parallel step (parallel/pipeline_stage.h does the stage's work).
#include "launcher/training/per_rank.h"
#include "launcher/training/trainer.h"

#include <optional>

namespace ht {

std::unique_ptr<PipelineStage> make_pipeline_stage(const Config& config, const DataSplits& data, Model& model,
                                                   Communicator* replicas, std::shared_ptr<Communicator> pipeline,
                                                   std::shared_ptr<Communicator> tensor) {
  if (config.parallel.pipeline_parallel <= 1) return nullptr;
  TORCH_CHECK(pipeline && pipeline->size() == config.parallel.pipeline_parallel, "Trainer: a pipeline group of ",
              pipeline ? pipeline->size() : 0, " ranks for parallel.pipeline_parallel = ",
              config.parallel.pipeline_parallel);
  // Every rank probes the same blocks with the same data; measured times are rank 0's everywhere.
  const Batch probe = data.train->slice(0, config.micro_batch_size());
  std::optional<TensorGroup> split;  // the probe of a split model exchanges with its group
  if (tensor) split.emplace(tensor);
  BlockProfile profile = profile_blocks(model, probe, config, split ? &*split : nullptr);
  if (config.parallel.stage_costs == StageCosts::kMeasured) {
    LocalCommunicator alone;
    share_block_costs(profile, replicas ? *replicas : alone, *pipeline, tensor.get());
  }
  PipelineLayout layout = make_pipeline_layout(config, model, std::move(profile));
  auto stage = std::make_unique<PipelineStage>(model, std::move(layout), std::move(pipeline),
                                               at::Device(config.training.device));
  stage->keep_only_own(model);
  return stage;
}

bool Trainer::writes_outputs() const {
  return replicas_.rank() == 0 && (!pipeline_ || pipeline_->rank() == 0) && (!tensor_ || tensor_->rank() == 0);
}

double Trainer::pipeline_step(const Batch& batch, StepResult& r) {
  (void)r;
  pipeline_->group().set_context("step " + std::to_string(state_.step + 1) + ", stage " +
                                 std::to_string(pipeline_->rank()));
  const double loss_seed = (scaler_ ? scaler_->scale() : 1.0) / static_cast<double>(config_.micro_batches());
  double loss = 0;
  {
    // The whole pipeline step is one step for the memory manager: its micro-batches interleave.
    struct Step {
      MemoryManager& memory;
      explicit Step(MemoryManager& m) : memory(m) { memory.begin_step(); }
      ~Step() { memory.end_step(/*completed=*/std::uncaught_exceptions() == 0); }
    } step{memory_};
    loss = pipeline_->train_step(interp_, batch.input, batch.target, config_.micro_batch_size(), loss_seed);
  }
  pipeline_->sum_tied_gradients();
  // Only the stage holding the loss has it; the others add zeros, exactly.
  return pipeline_->sum(loss, "the loss");
}

void Trainer::gather_stage_stats(StepResult& r) {
  const PipelineStats& s = pipeline_->stats();
  auto rows = gather_per_rank(pipeline_->group(),
                              {s.compute_ms, s.wait_ms, static_cast<double>(s.p2p_bytes),
                               static_cast<double>(r.mem_peak_bytes)},
                              "the stages' step statistics");
  r.stage_compute_ms = std::move(rows[0]);
  r.stage_wait_ms = std::move(rows[1]);
  r.stage_p2p_bytes = std::move(rows[2]);
  r.stage_peak_bytes = std::move(rows[3]);
}

}  // namespace ht

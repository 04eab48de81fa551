#include "training/pipeline_runner.h"

#include "training/per_rank.h"

#include "alloc/cpu_device_allocator.h"

#include <exception>

namespace ht {

at::Tensor PipelineRunner::run(const Batch& batch, double loss_seed, GradientSync&) {
  at::Tensor loss;
  {
    // The whole pipeline step is one step for the memory manager: its micro-batches interleave.
    struct Step {
      MemoryManager& memory;
      explicit Step(MemoryManager& m) : memory(m) { memory.begin_step(); }
      ~Step() { memory.end_step(/*completed=*/std::uncaught_exceptions() == 0); }
    } step{engine_.memory};
    loss = stage_->train_step(engine_.interp, batch.input, batch.target, batch_.micro, loss_seed);
  }
  // Only the stage holding the loss has it; the others add zeros, exactly. On the device (a CPU
  // rank's outside its arena, as LocalRunner's, so no block stands beside what the planner
  // counts), read by the trainer once the update is queued.
  stage_->sum(loss, "the loss");
  return loss.reshape({});
}

void PipelineRunner::step_ended(int64_t peak_bytes) {
  const PipelineStats& s = stage_->stats();
  auto rows = gather_per_rank(stage_->group(),
                              {s.compute_ms, s.wait_ms, static_cast<double>(s.p2p_bytes),
                               static_cast<double>(peak_bytes)},
                              "the stages' step statistics");
  compute_ms_ = std::move(rows[0]);
  wait_ms_ = std::move(rows[1]);
  p2p_bytes_ = std::move(rows[2]);
  peak_bytes_ = std::move(rows[3]);
}

void PipelineRunner::record(JsonObject& record) const {
  record.add("stage_compute_ms", compute_ms_).add("stage_wait_ms", wait_ms_).add("stage_p2p_bytes", p2p_bytes_)
      .add("stage_peak_bytes", peak_bytes_);
}

}  // namespace ht

#pragma once
// The training loop, made of parts chosen once when the job is built (training/trainer_parts.h)
// from one resolved plan (training/run_plan.h). One step:
//
//   the step runner      forward and backward of this rank's share of the batch, micro-batch by
//                        micro-batch (or a pipeline stage's schedule), the loss scaled by
//                        1 / micro-batches; gradients accumulate in the parameters' slots
//   the gradient sync    combines them across the ranks that hold them (begun during backward)
//   the optimizer step   checks, clips and steps them at the scheduled rate
//
// and evaluation, metrics and checkpoints (ModelState, whatever the layout) at their intervals.
// The trainer asks no part which mode it is in: what differs between one rank, data, pipeline,
// tensor and sharded parallelism, a memory policy or a precision is which parts it was given.

#include "alloc/memory_timeline.h"
#include "training/batches.h"
#include "training/checkpoint.h"
#include "training/checkpointing.h"
#include "training/dataset.h"
#include "training/engine.h"
#include "training/model_state.h"
#include "training/run_output.h"
#include "training/sampler.h"
#include "training/trainer_parts.h"

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ht {

struct EvalResult {
  double loss = 0;
  std::optional<double> accuracy;    // classification
  std::optional<double> perplexity;  // language models
  // Language models whose data knows its bytes of text per token: loss / ln 2 / bytes per token,
  // the one number that compares across vocabularies (characters, SentencePiece, GPT-2's).
  std::optional<double> bits_per_byte;
  int64_t samples = 0;
  double seconds = 0;  // wall time of the evaluation, this rank's
};

struct TrainResult {
  int64_t steps = 0, resumed_from_step = 0;
  double final_loss = 0;
  std::optional<EvalResult> eval;
  int64_t mem_peak_bytes = -1;  // -1: not measured on this device
  double seconds = 0;
  int64_t samples = 0;
  int stopped_by = 0;  // the signal that stopped training after `steps` (stop_signals.h); 0: ran to the end
};

class Trainer {
 public:
  // `engine` and `parts` as make_trainer_parts made them for `plan` (a test may replace a part).
  // Writes nothing.
  Trainer(const RunPlan& plan, DataSplits data, std::unique_ptr<Engine> engine, TrainerParts parts);
  // The trainer `plan` asks for: make_engine, then make_trainer_parts over `groups`.
  static std::unique_ptr<Trainer> make(const RunPlan& plan, DataSplits data, std::shared_ptr<Model> model,
                                       std::shared_ptr<CpuArena> arena, RankCommunicators groups = {});

  // Continues from a verified checkpoint folder.
  void resume_from(const std::string& folder);
  // Trains to the planned step count, writing metrics and checkpoints into `output` (null on
  // ranks other than the job's first, which write nothing).
  TrainResult run(RunOutput* output);
  EvalResult evaluate();
  // Ends the memory trace now (the run stops early).
  void close_trace() {
    engine_->memory.set_timeline(nullptr);
    timeline_.reset();
  }

  // One step as the planner profiles it: its time in parts and its memory.
  struct StepMeasurement {
    double step_ms = 0, forward_backward_ms = 0, optimizer_ms = 0;
    int64_t peak_bytes = -1;       // the arena's peak (with a budget)
    int64_t forward_backward_peak_bytes = -1;  // its peak to the end of the last backward
    int64_t optimizer_peak_bytes = -1;  // its peak from the gradients' averaging to the step's end
    int64_t in_use_before = 0;     // the arena's bytes in use when the step began
  };
  StepMeasurement measure_step();
  // The planner's prediction for this run (launcher/planning/run_check.h), recorded beside what
  // each step measures.
  void set_prediction(int64_t peak_bytes, double step_ms) {
    predicted_peak_bytes_ = peak_bytes;
    predicted_step_ms_ = step_ms;
  }

  int64_t total_steps() const { return total_steps_; }
  int64_t steps_per_epoch() const { return sampler_.batches_per_epoch(); }
  const TrainerState& state() const { return state_; }
  Model& model() { return *engine_->model; }
  const MemoryManager& memory() const { return engine_->memory; }
  MemoryManager& memory() { return engine_->memory; }
  Interpreter& interpreter() { return engine_->interp; }
  // Lines that say how the parts split the work (a pipeline's stages), for the log.
  const std::vector<std::string>& description() const { return parts_.description; }

 private:
  struct StepResult {
    double loss = 0, grad_norm = 0, lr = 0, ms = 0;
    double forward_backward_ms = 0, optimizer_ms = 0;  // parts of ms
    bool skipped = false;  // fp16: a gradient was not finite
    int64_t mem_peak_bytes = -1;        // the step's: the larger of its two phases
    int64_t forward_backward_peak_bytes = -1;  // to the end of the last micro-batch's backward
    int64_t optimizer_peak_bytes = -1;  // from the gradients' averaging on: the optimizer's working memory
    // The memory manager during this step.
    int64_t evictions = 0, recomputations = 0;
    double recompute_ms = 0, fragmentation = 0;
    // Host swap during this step: bytes each way, compute's waiting, bytes in that were back
    // before their read (hidden), and the host memory's peak.
    int64_t swap_out_bytes = 0, swap_in_bytes = 0, swap_in_hidden_bytes = 0, host_peak_bytes = 0;
    double swap_wait_ms = 0;
    // Per data-parallel replica, on logged steps: the step, forward and backward, waiting for the
    // all-reduce after backward, the optimizer, the memory peak (a slow rank shows as the others'
    // waiting).
    std::vector<double> rank_step_ms, rank_compute_ms, rank_wait_ms, rank_optimizer_ms, rank_peak_bytes;
  };
  // What a step's records count from: the counters before it (trainer_records.cpp).
  struct StepStart {
    MemoryStats memory;
    SwapStats swap;
  };
  StepStart begin_step();
  void end_step(const StepStart& start, StepResult& r);
  void trace_step_begins();
  void trace_step_ended();
  // `phases_apart`: the forward and backward timed on their own (the profiler's step), the host
  // waiting for the device at their end; a training step does not wait before its update.
  StepResult train_step(bool phases_apart = false);
  bool eval_due() const;
  // A collective of the replicas (their per-rank figures): every rank calls it.
  void log_step(StepResult& r);
  void log_eval(const EvalResult& e);
  // A checkpoint published: the hang note names it, metrics.jsonl records it (trainer_records.cpp).
  void checkpoint_published(const CheckpointRecord& r);
  void log_checkpoint(const CheckpointRecord& r);
  // metrics.time_by_op: the step's kernel times by op, added up after the warm-up steps; at the
  // end, a "time_by_op" record and a log line (trainer_records.cpp).
  void add_time_by_op();
  void log_time_by_op();
  // The ranks' sums of an evaluation combined into its result (a collective with several ranks).
  EvalResult finish_evaluation(double loss_sum, int64_t correct, int64_t samples, double seconds);

  const RunPlan plan_;
  DataSplits data_;
  // memory.trace: declared before the engine, whose memory manager writes into it, so it goes after.
  std::unique_ptr<MemoryTimeline> timeline_;
  std::unique_ptr<Engine> engine_;
  TrainerParts parts_;
  Sampler sampler_;
  ContextLayout context_;  // this rank's chunks of each sequence (the whole without context parallelism)
  Batches batches_;        // drawn from sampler_, in context_'s chunks
  CheckpointStore checkpoints_;
  // After the parts (it writes through their state) and the progress it reports to.
  RunOutput* output_ = nullptr;  // during run()
  int64_t total_steps_;
  Progress progress_;
  std::unique_ptr<Checkpointing> checkpointing_;
  TrainerState state_;
  TrainResult result_;
  std::map<std::string, double> op_ms_;       // metrics.time_by_op: kernel times over the measured steps
  int64_t op_steps_ = 0, op_first_step_ = 0;
  int64_t predicted_peak_bytes_ = -1;  // -1: no prediction
  double predicted_step_ms_ = 0;
};

}  // namespace ht

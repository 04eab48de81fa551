#include "training/trainer.h"
#include "base/clock.h"

#include "alloc/cpu_device_allocator.h"
#include "training/stop_signals.h"
#include "parallel/stall_note.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>

namespace ht {
namespace {

// What a rank that finds a collective never completing says of checkpoints (parallel/stall_note.h):
// none can be written then, and the last complete one is the one to resume.
void note_last_checkpoint(const std::string& folder, int64_t step) {
  const std::string last = folder.empty()
      ? "no checkpoint of this run is complete yet"
      : "the last complete checkpoint is " + folder + " (step " + std::to_string(step) +
            "): resume from it with --checkpoint.resume=latest";
  set_stall_note("No checkpoint can be written now: every rank takes part in writing one (its slices, or the "
                 "gathers before rank 0 writes), and the collective holds this rank; " + last);
}


int64_t total_steps_of(const LoopPlan& loop, const Sampler& sampler) {
  return loop.steps > 0 ? loop.steps : loop.epochs * sampler.batches_per_epoch();
}

}  // namespace

std::unique_ptr<Trainer> Trainer::make(const RunPlan& plan, DataSplits data, std::shared_ptr<Model> model,
                                       std::shared_ptr<CpuArena> arena, RankCommunicators groups) {
  auto engine = std::make_unique<Engine>(plan, std::move(model), std::move(arena));
  TrainerParts parts = make_trainer_parts(plan, data, *engine, std::move(groups));
  return std::make_unique<Trainer>(plan, std::move(data), std::move(engine), std::move(parts));
}

Trainer::Trainer(const RunPlan& plan, DataSplits data, std::unique_ptr<Engine> engine, TrainerParts parts)
    : plan_(plan), data_(std::move(data)), engine_(std::move(engine)), parts_(std::move(parts)),
      // A replica's context ranks (neighbours among the ranks with its weights) train its samples.
      sampler_(data_.train->size(), plan.batch.global, plan.seed, plan.loop.shuffle,
               parts_.groups->replicas().rank() / plan.grid.context, parts_.groups->replicas().size() / plan.grid.context),
      context_{plan.grid.context, plan.grid.context_rank},
      batches_(*data_.train, sampler_, context_, engine_->device, /*ahead=*/engine_->device.is_cuda()),
      checkpoints_(plan.loop.checkpoint_dir, plan.loop.checkpoint_keep),
      total_steps_(total_steps_of(plan.loop, sampler_)), progress_(total_steps_, plan.loop.log_interval) {
  progress_.set_silent(!parts_.groups->first_rank());
  if (!parts_.groups->alone()) progress_.use_log_lines();
  for (const std::string& line : parts_.notes) progress_.line(line);
  checkpointing_ = make_checkpointing(plan.loop.checkpoint_async, checkpoints_, *parts_.state, *parts_.groups, progress_,
                                      [this](const CheckpointRecord& r) { checkpoint_published(r); });
}

void Trainer::checkpoint_published(const CheckpointRecord& r) {
  if (!r.folder.empty()) note_last_checkpoint(r.folder, r.step);
  if (output_ != nullptr) log_checkpoint(r);
}

void Trainer::resume_from(const std::string& folder) {
  state_ = parts_.state->load(folder);
  batches_.seek(state_.sampler);
  engine_->interp.set_seed_counter(state_.seed_counter);
  parts_.optimizer->restore(state_.loss_scaler);
  result_.resumed_from_step = state_.step;
  progress_.line("resumed from " + folder + " at step " + std::to_string(state_.step));
  note_last_checkpoint(folder, state_.step);
}

// One step: forward and backward of this replica's share of the batch, the gradients combined,
// the optimizer's update.
Trainer::StepResult Trainer::train_step(bool phases_apart) {
  const StepStart counters = begin_step();
  const auto start = std::chrono::steady_clock::now();
  StepResult r;
  parts_.groups->step_begins(state_.step + 1);
  const Batch batch = batches_.take();
  const auto compute_start = std::chrono::steady_clock::now();
  const double loss_seed = parts_.optimizer->loss_scale() / static_cast<double>(plan_.batch.micro_batches);
  const at::Tensor loss = parts_.runner->run(batch, loss_seed, *parts_.sync);
  if (phases_apart) loss.item<double>();  // read: the device's forward and backward have ended
  r.forward_backward_ms = ms_since(compute_start);
  // The two phases' peaks apart: forward and backward's grows with the micro-batch, the
  // optimizer's with the largest tensor it steps (the planner scales each on its own).
  r.forward_backward_peak_bytes = engine_->device_peak_bytes();
  engine_->reset_device_peak();
  // The gradients of this rank's slice are complete: combined over the replicas, once per
  // optimizer step (with overlap, most buckets are under way already).
  parts_.sync->begin()->wait();
  r.lr = parts_.optimizer->learning_rate(state_.step, total_steps_);
  const auto optimizer_start = std::chrono::steady_clock::now();
  const StepOutcome outcome = parts_.optimizer->step(r.lr);
  r.optimizer_ms = ms_since(optimizer_start);
  // While the device runs the step's kernels (a GPU's: training/batches.h).
  if (state_.step + 1 < total_steps_) batches_.draw_ahead();
  // Read once the update is queued: the host has not waited for the device since the step began
  // (but for fp16's loss scaler, a pipeline's norms and collectives over MPI: training/optimizer.h). Outside the
  // optimizer's time: the replicas' mean waits for the slowest of them.
  r.loss = parts_.groups->replicas().mean(loss.item<double>(), "the loss");
  r.grad_norm = outcome.grad_norm.item<double>();
  r.skipped = !outcome.stepped;
  ++state_.step;
  if (auto scaler = parts_.optimizer->scaler_state()) state_.loss_scaler = scaler;
  state_.sampler = batches_.position();
  state_.seed_counter = engine_->interp.seed_counter();
  r.ms = ms_since(start);
  r.optimizer_peak_bytes = engine_->device_peak_bytes();
  r.mem_peak_bytes = std::max(r.forward_backward_peak_bytes, r.optimizer_peak_bytes);
  end_step(counters, r);
  return r;
}

Trainer::StepMeasurement Trainer::measure_step() {
  StepMeasurement m;
  const CpuArena* arena = engine_->arena.get();
  m.in_use_before = arena ? arena->stats().in_use : 0;
  const StepResult r = train_step(/*phases_apart=*/true);
  m.step_ms = r.ms;
  m.forward_backward_ms = r.forward_backward_ms;
  m.optimizer_ms = r.optimizer_ms;
  m.peak_bytes = arena ? r.mem_peak_bytes : -1;
  m.forward_backward_peak_bytes = arena ? r.forward_backward_peak_bytes : -1;
  m.optimizer_peak_bytes = arena ? r.optimizer_peak_bytes : -1;
  return m;
}

TrainResult Trainer::run(RunOutput* output) {
  output_ = output;
  const auto start = std::chrono::steady_clock::now();
  const int64_t first = state_.step;
  if (first == 0) note_last_checkpoint("", 0);
  while (state_.step < total_steps_) {
    StepResult last = train_step();
    result_.final_loss = last.loss;
    result_.mem_peak_bytes = std::max(result_.mem_peak_bytes, last.mem_peak_bytes);
    if (!std::isfinite(last.loss)) {
      progress_.line("warning: loss is " + std::to_string(last.loss) + " at step " + std::to_string(state_.step) +
                     "; try a lower training.lr or training.grad_clip");
    }
    if (last.skipped) {
      progress_.line("step " + std::to_string(state_.step) + " skipped: a gradient was inf or NaN; loss scale now " +
                     std::to_string(parts_.optimizer->loss_scale()));
    }
    progress_.step(state_.step, last.loss, last.lr, static_cast<double>(plan_.batch.global) / (last.ms / 1e3));
    if (state_.step % plan_.loop.log_interval == 0 || state_.step == total_steps_) log_step(last);
    if (eval_due()) log_eval(evaluate());
    checkpointing_->poll(state_.step);  // an async checkpoint every rank has written is published
    const int64_t every = plan_.loop.checkpoint_interval;
    const bool due = every > 0 && (state_.step % every == 0 || state_.step == total_steps_);
    if (due) checkpointing_->save(state_);
    if (const int signal = parts_.groups->agreed_stop_signal(StopSignals::received())) {
      if (!due) checkpointing_->save(state_);
      checkpointing_->drain(state_.step);
      // No rank ends before the checkpoint is written: mpirun ends the whole job when one does.
      parts_.groups->barrier("the checkpoint before stopping");
      result_.stopped_by = signal;
      break;
    }
  }
  checkpointing_->drain(state_.step);
  progress_.finish();
  if (op_steps_ > 0) log_time_by_op();
  result_.steps = state_.step;
  result_.seconds = seconds_since(start);
  result_.samples = (state_.step - first) * plan_.batch.global;
  return result_;
}

bool Trainer::eval_due() const {
  if (state_.step == total_steps_) return true;
  const int64_t every = plan_.loop.eval_interval;
  if (every > 0) return state_.step % every == 0;
  return state_.step % sampler_.batches_per_epoch() == 0;  // end of an epoch
}

}  // namespace ht

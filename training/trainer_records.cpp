// The trainer's records in metrics.jsonl (and their log lines): one per logged step, one per
// evaluation; what a step counts from, and its memory trace. What each field means is in
// docs/running.md. Each part of the trainer writes its own fields (training/trainer_parts.h).
#include "training/per_rank.h"
#include "training/trainer.h"
#include "runtime/ops.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace ht {

Trainer::StepStart Trainer::begin_step() {
  engine_->op_times.clear();  // an evaluation's kernels are not the step's
  engine_->reset_device_peak();
  engine_->memory.reset_peak();
  StepStart s;
  s.memory = engine_->memory.stats();
  if (const SwapStats* swap = engine_->memory.swap_stats()) s.swap = *swap;
  trace_step_begins();
  return s;
}

void Trainer::end_step(const StepStart& start, StepResult& r) {
  const MemoryStats& after = engine_->memory.stats();
  r.evictions = after.evictions - start.memory.evictions;
  r.recomputations = after.recomputations - start.memory.recomputations;
  r.recompute_ms = after.recompute_ms - start.memory.recompute_ms;
  r.fragmentation = after.fragmentation_at_peak;
  if (const SwapStats* swap = engine_->memory.swap_stats()) {
    r.swap_out_bytes = swap->bytes_out - start.swap.bytes_out;
    r.swap_in_bytes = swap->bytes_in - start.swap.bytes_in;
    r.swap_in_hidden_bytes = swap->bytes_in_hidden - start.swap.bytes_in_hidden;
    r.swap_wait_ms = swap->wait_ms - start.swap.wait_ms;
    r.host_peak_bytes = swap->peak_host_bytes;
  }
  parts_.runner->step_ended(r.mem_peak_bytes);
  trace_step_ended();
  if (engine_->interp.op_time_log() != nullptr) add_time_by_op();
}

void Trainer::trace_step_begins() {
  if (!plan_.memory.trace || state_.step >= plan_.memory.trace_steps || !parts_.groups->first_rank()) return;
  if (!timeline_) {
    // Opened at the first traced step, not before: a run that fails its checks writes nothing.
    timeline_ = std::make_unique<MemoryTimeline>(plan_.loop.output_dir + "/memory_trace.json", engine_->arena.get());
    // The trace must see this interpreter's kernels: it was configured without one.
    engine_->memory.set_timeline(timeline_.get());
  }
  timeline_->set_recording(true);
  timeline_->marker("step " + std::to_string(state_.step + 1));
}

void Trainer::trace_step_ended() {
  if (!timeline_ || !timeline_->recording()) return;
  timeline_->set_recording(false);
  if (state_.step >= plan_.memory.trace_steps || state_.step == total_steps_) {
    timeline_->close();
    progress_.line("memory trace: " + timeline_->path());
  }
}

void Trainer::log_step(StepResult& r) {
  // Per data-parallel replica (none with one): a slow rank shows as the others' waiting.
  auto rows = parts_.groups->per_replica({r.ms, r.forward_backward_ms, parts_.sync->stats().wait_ms, r.optimizer_ms,
                                          static_cast<double>(r.mem_peak_bytes)},
                                         "the replicas' step statistics");
  if (!rows.empty()) {
    r.rank_step_ms = std::move(rows[0]);
    r.rank_compute_ms = std::move(rows[1]);
    r.rank_wait_ms = std::move(rows[2]);
    r.rank_optimizer_ms = std::move(rows[3]);
    r.rank_peak_bytes = std::move(rows[4]);
  }
  if (output_ == nullptr) return;
  const MemoryManager& memory = engine_->memory;
  const MemoryStats& mem = memory.stats();
  JsonObject record;
  record.add("event", "train").add("step", state_.step).add("epoch", state_.sampler.epoch).add("loss", r.loss)
      .add("lr", r.lr).add("grad_norm", r.grad_norm).add("step_ms", r.ms)
      .add("forward_backward_ms", r.forward_backward_ms).add("optimizer_ms", r.optimizer_ms)
      .add("samples_per_s", static_cast<double>(plan_.batch.global) / (r.ms / 1e3))
      .add("mem_peak_bytes", r.mem_peak_bytes >= 0 ? std::optional<int64_t>(r.mem_peak_bytes) : std::nullopt)
      .add("mem_budget_bytes", engine_->arena ? std::optional<int64_t>(engine_->arena->capacity()) : std::nullopt)
      .add("activation_peak_bytes", mem.peak_resident_bytes).add("evictions", r.evictions)
      .add("recomputations", r.recomputations).add("recompute_ms", r.recompute_ms)
      .add("fragmentation", r.fragmentation);
  if (const StaticPlanner* planner = memory.static_planner()) {
    const StaticPlanStats& p = planner->stats();
    record.add("plan_hits", p.plan_hits).add("plan_diverged", p.plan_diverged).add("plans", p.plans)
        .add("plans_ahead", p.plans_ahead)
        .add("plan_solve_ms", p.plan_solve_ms).add("plan_evictions", p.plan_evictions)
        .add("plan_recomputations", p.plan_recomputations).add("layout_misses", p.layout_misses)
        .add("planned_peak_bytes", p.last_planned_peak);
  }
  if (memory.swap_stats() != nullptr) {
    record.add("swap_out_bytes", r.swap_out_bytes).add("swap_in_bytes", r.swap_in_bytes)
        .add("swap_in_hidden_bytes", r.swap_in_hidden_bytes).add("swap_wait_ms", r.swap_wait_ms)
        .add("host_peak_bytes", r.host_peak_bytes);
  }
  if (predicted_peak_bytes_ >= 0) {
    record.add("predicted_peak_bytes", predicted_peak_bytes_).add("predicted_step_ms", predicted_step_ms_);
  }
  parts_.runner->record(record);
  if (!r.rank_step_ms.empty()) {
    record.add("rank_step_ms", r.rank_step_ms).add("rank_compute_ms", r.rank_compute_ms)
        .add("rank_wait_ms", r.rank_wait_ms).add("rank_optimizer_ms", r.rank_optimizer_ms)
        .add("rank_peak_bytes", r.rank_peak_bytes);
  }
  parts_.sync->record(record);
  parts_.optimizer->record(record);
  parts_.groups->record(record);
  output_->metrics(record);
}

void Trainer::log_checkpoint(const CheckpointRecord& r) {
  JsonObject record;
  record.add("event", "checkpoint").add("step", r.step).add("folder", r.folder).add("async", r.async)
      .add("blocked_s", r.blocked_s);
  if (r.async) {
    record.add("host_bytes", r.host_bytes).add("waited_s", r.waited_s).add("write_s", r.write_s)
        .add("publish_s", r.publish_s).add("published_after", r.published_after);
  }
  output_->metrics(record);
}

void Trainer::log_eval(const EvalResult& e) {
  if (output_ == nullptr) return;
  JsonObject record;
  record.add("event", "eval").add("step", state_.step).add("eval_loss", e.loss).add("eval_samples", e.samples)
      .add("eval_s", e.seconds);
  std::string text = "eval at step " + std::to_string(state_.step) + ": loss " + std::to_string(e.loss);
  if (e.accuracy) {
    record.add("eval_accuracy", *e.accuracy);
    text += ", accuracy " + std::to_string(*e.accuracy);
  }
  if (e.perplexity) {
    record.add("eval_perplexity", *e.perplexity);
    text += ", perplexity " + std::to_string(*e.perplexity);
  }
  if (e.bits_per_byte) {
    record.add("eval_bits_per_byte", *e.bits_per_byte);
    text += ", " + std::to_string(*e.bits_per_byte) + " bits per byte";
  }
  output_->metrics(record);
  progress_.line(text);
}

namespace {

std::string ms_text(double ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f ms", ms);
  return buf;
}

}  // namespace

// The first five steps are warm-up (cuDNN's and cuBLAS's choices, the allocator's first blocks),
// as scripts/compare_plan_run.py counts them; a shorter run measures from its second step.
void Trainer::add_time_by_op() {
  const std::map<std::string, double> ms = engine_->op_times.take_ms();  // waits for the step's kernels
  const int64_t warmup = total_steps_ > 5 ? 5 : std::min<int64_t>(1, total_steps_ - 1);
  if (state_.step <= warmup) return;
  if (op_steps_++ == 0) op_first_step_ = state_.step;
  for (const auto& [op, t] : ms) op_ms_[op] += t;
}

void Trainer::log_time_by_op() {
  if (output_ == nullptr) return;
  std::vector<std::pair<double, std::string>> order;
  double total = 0;
  JsonObject per_step;
  for (const auto& [op, t] : op_ms_) {
    const double ms = t / static_cast<double>(op_steps_);
    order.emplace_back(ms, op);
    total += ms;
    per_step.add(op, ms);
  }
  std::sort(order.rbegin(), order.rend());
  JsonObject record;
  record.add("event", "time_by_op").add("first_step", op_first_step_).add("steps", op_steps_)
      .add("kernel_ms_per_step", total).add("ms_per_step", per_step);
  // Which attention kernel ran (runtime/ops/attention.cpp chooses from the inputs): the time of
  // "attention" means little without it. Counts over the whole run, recomputations included.
  const detail::AttentionKernelCounts kernels = detail::attention_kernel_counts();
  if (kernels.fused + kernels.blockwise > 0) {
    record.add("attention_forwards", JsonObject()
                                         .add("flash", kernels.flash)
                                         .add("efficient", kernels.fused - kernels.flash)
                                         .add("blockwise", kernels.blockwise));
  }
  output_->metrics(record);
  std::string text = "time by op, measured (ms per step, steps " + std::to_string(op_first_step_) + "-" +
                     std::to_string(op_first_step_ + op_steps_ - 1) + ", " + ms_text(total) + " in kernels):";
  for (size_t i = 0; i < std::min<size_t>(order.size(), 8); ++i) {
    text += (i ? ", " : " ") + order[i].second + " " + ms_text(order[i].first) + " (" +
            std::to_string(static_cast<int>(std::lround(100 * order[i].first / std::max(total, 1e-9)))) + "%)";
  }
  if (kernels.fused + kernels.blockwise > 0) {
    text += "; attention forwards: " + std::to_string(kernels.flash) + " flash, " +
            std::to_string(kernels.fused - kernels.flash) + " memory-efficient, " +
            std::to_string(kernels.blockwise) + " blockwise";
  }
  progress_.line(text);
}

}  // namespace ht

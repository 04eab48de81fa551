#include "memory/static_plan.h"

#include "alloc/cpu_arena.h"
#include "alloc/cpu_device_allocator.h"
#include "alloc/step_layout.h"
#include "runtime/memory_hooks.h"
#include "schedule/checkpoint_segments.h"
#include "schedule/solver.h"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace ht {

struct StaticPlanner::Plan {
  std::vector<uint64_t> signatures;          // per forward op
  int64_t fixed_bytes = 0;                   // what the arena held when its step began
  int64_t peak_bytes = 0;                    // its simulated peak, fixed bytes included
  std::vector<int> block_starts;             // where the model's blocks began (segments)
  std::vector<int> stage_ops;                // per backward stage: its forward op
  schedule::Schedule schedule;
  std::vector<std::vector<int>> forward_drops;  // per forward op: values dropped right after it
  std::vector<std::vector<int>> early_free;     // per stage: schedule::early_free_points
  schedule::StepGraph graph;                    // what it was made from
  StepLayout layout;
  bool layout_recorded = false;
  bool made_ahead = false;  // by plan_ahead, from a trace
};

namespace {

// Values a schedule drops right after forward op k: not kept, and k their last forward use (or
// their producer when no forward op reads them).
std::vector<std::vector<int>> forward_drops(const schedule::StepGraph& g, const schedule::Schedule& s) {
  std::vector<std::vector<int>> drops(g.forward.size());
  for (size_t v = 0; v < g.values.size(); ++v) {
    const schedule::Value& val = g.values[v];
    if (!val.droppable || s.keep[v]) continue;
    const int at = val.last_forward_use >= 0 ? val.last_forward_use : val.producer;
    if (at >= 0) drops[static_cast<size_t>(at)].push_back(static_cast<int>(v));
  }
  return drops;
}

}  // namespace

StaticPlanner::StaticPlanner(StaticPlanOptions options, CpuArena& arena, Rematerializer& remat,
                             std::function<void(TensorInfo&)> evict)
    : options_(options), arena_(arena), remat_(remat), evict_(std::move(evict)) {}

StaticPlanner::~StaticPlanner() {
  if (layout_plan_ != nullptr) set_placement_advisor(nullptr);
}

void StaticPlanner::begin_step() {
  capture_ = std::make_unique<StepCapture>(&arena_, arena_.stats().in_use);
  block_starts_.clear();
  forward_done_ = false;
  stage_ = 0;
  candidates_.clear();
  const int64_t fixed = arena_.stats().in_use;
  std::vector<uint64_t> outgrown;
  for (auto& [hash, plan] : plans_) {
    if (plan->fixed_bytes >= fixed) continue;
    // A plan made ahead from a trace has counted on the optimizer's state; what the trace could
    // not see (the trainer's small tensors, 2 KB on a 6-layer GPT) may take a quarter of the
    // margin, which is kept for what a plan cannot see, rather than cost a second solve.
    const int64_t unseen = plan->made_ahead ? (arena_.capacity() - plan_budget()) / 4 : 0;
    if (plan->peak_bytes + (fixed - plan->fixed_bytes) <= plan_budget() + unseen) {
      plan->peak_bytes += fixed - plan->fixed_bytes;  // still fits: the same plan, less room to spare
      plan->fixed_bytes = fixed;
      continue;
    }
    outgrown.push_back(hash);
  }
  for (uint64_t hash : outgrown) {
    // The plan counted on the memory outside its step (parameters, optimizer state); that grew
    // (optimizer state appears after the first step): solve it again for what is left.
    ++stats_.plans_outgrown;
    std::unique_ptr<Plan> old = std::move(plans_[hash]);
    plans_.erase(hash);
    old->graph.fixed_bytes = fixed;
    if (!make_plan(hash, old->graph, old->signatures, old->block_starts)) sightings_[hash] = -1000000;
  }
  for (auto& [hash, plan] : plans_) candidates_.push_back(plan.get());
  plan_ = candidates_.empty() ? nullptr : candidates_.front();
  if (plan_ != nullptr && options_.static_layout) {
    if (plan_->layout_recorded) {
      plan_->layout.begin_replay();
    } else {
      plan_->layout.begin_recording(arena_);
    }
    set_placement_advisor(&plan_->layout);
    layout_plan_ = plan_;
  }
}

int64_t StaticPlanner::plan_budget() const {
  return static_cast<int64_t>(static_cast<double>(arena_.capacity()) * (1.0 - options_.budget_margin));
}

void StaticPlanner::end_layout(bool completed) {
  if (layout_plan_ == nullptr) return;
  Plan* plan = layout_plan_;
  layout_plan_ = nullptr;
  set_placement_advisor(nullptr);
  StepLayout& layout = plan->layout;
  if (plan->layout_recorded) {
    layout.end_replay();
    stats_.layout_misses += layout.misses();
  } else {
    layout.end_recording();
    // Only a step the plan ran to its end lays out the plan's blocks.
    plan->layout_recorded = completed && layout.has_plan() && layout.plan_fits();
    if (plan->layout_recorded) stats_.layout_footprint = layout.planned_peak_bytes();
  }
}

void StaticPlanner::diverge() {
  end_layout(/*completed=*/false);
  if (plan_ != nullptr) ++stats_.plan_diverged;
  plan_ = nullptr;
  candidates_.clear();
  holds_.clear();  // what the plan recomputed goes back to the interpreter's own rules
}

void StaticPlanner::end_step(bool step_completed) {
  if (!capture_) return;
  if (!step_completed) {
    diverge();
    capture_.reset();
    return;
  }
  const bool completed = plan_ != nullptr && stage_ == static_cast<int>(plan_->stage_ops.size()) &&
                         capture_->forward_ops() == plan_->signatures.size();
  if (plan_ != nullptr && !completed) {
    diverge();
  } else if (completed) {
    end_layout(/*completed=*/true);
    ++stats_.plan_hits;
  }
  holds_.clear();
  plan_ = nullptr;
  candidates_.clear();
  const uint64_t hash = capture_->finish();
  if (options_.capture_only) {
    last_step_ = std::make_unique<CapturedStep>(CapturedStep{capture_->graph(), block_starts_, capture_->signatures(), hash});
    capture_.reset();
    return;
  }
  if (!completed && plans_.count(hash) == 0 && ++sightings_[hash] >= options_.sightings_before_planning &&
      !make_plan(hash, capture_->graph(), capture_->signatures(), block_starts_)) {
    sightings_[hash] = -1000000;  // never again: its steps stay under DTR
  }
  capture_.reset();
}

bool StaticPlanner::plan_ahead(const CapturedStep& step) {
  if (options_.capture_only || plans_.count(step.sequence_hash) > 0) return false;
  if (!make_plan(step.sequence_hash, schedule::weighed_by_model(step.graph), step.signatures, step.block_starts)) {
    return false;
  }
  ++stats_.plans_ahead;
  plans_[step.sequence_hash]->made_ahead = true;
  return true;
}

bool StaticPlanner::make_plan(uint64_t hash, const schedule::StepGraph& graph, const std::vector<uint64_t>& signatures,
                              const std::vector<int>& block_starts) {
  const auto start = std::chrono::steady_clock::now();
  auto plan = std::make_unique<Plan>();
  if (options_.source == PlanSource::kSegments) {
    plan->schedule = schedule::checkpoint_segments(graph, block_starts);
    const schedule::ScheduleCost cost = schedule::simulate(graph, plan->schedule);
    stats_.last_solver = "segments";
    stats_.last_status = cost.valid ? "segments" : "invalid: " + cost.invalid_reason;
    stats_.last_predicted_ms = cost.recompute_ms;
    stats_.last_gap = 0;
    stats_.last_planned_peak = cost.peak_bytes;
    if (!cost.valid) plan.reset();
  } else {
    schedule::SolveOptions opts;
    opts.budget_bytes = plan_budget();
    opts.time_limit_s = options_.solve_time_limit_s;
    opts.use_mip = options_.solve_time_limit_s > 0;
    schedule::SolveResult r =
        schedule::solve(options_.modeled_costs ? schedule::weighed_by_model(graph) : graph, opts);
    if (options_.modeled_costs) r.cost = schedule::simulate(graph, r.schedule);  // the measured times
    stats_.last_solver = r.solver;
    stats_.last_status = schedule::solve_status_name(r.status);
    stats_.last_predicted_ms = r.cost.recompute_ms;
    stats_.last_gap = r.gap;
    stats_.last_planned_peak = r.cost.peak_bytes;
    if (r.status == schedule::SolveStatus::kInfeasible) {
      plan.reset();
    } else {
      plan->schedule = std::move(r.schedule);
    }
  }
  stats_.plan_solve_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (!plan) {
    ++stats_.unplannable;
    return false;
  }
  plan->signatures = signatures;
  plan->block_starts = block_starts;
  plan->fixed_bytes = graph.fixed_bytes;
  plan->peak_bytes = stats_.last_planned_peak;
  for (const schedule::BackwardStage& s : graph.backward) plan->stage_ops.push_back(s.forward_op);
  plan->forward_drops = forward_drops(graph, plan->schedule);
  for (size_t st = 0; st < graph.backward.size(); ++st) {
    plan->early_free.push_back(schedule::early_free_points(graph, plan->schedule, static_cast<int>(st)));
  }
  plan->graph = graph;
  ++stats_.plans;
  plans_[hash] = std::move(plan);
  return true;
}

void StaticPlanner::kernel_begins(bool recompute, bool backward) {
  if (capture_ && !recompute) capture_->kernel_begins();
}

void StaticPlanner::kernel_ends(bool recompute, bool backward) {
  if (!capture_ || recompute) return;
  capture_->kernel_ends();
  if (backward) capture_->backward_stage_ran();
}

void StaticPlanner::forward_op(const ComputePath& path, const std::vector<Tensor>& outputs, bool taped) {
  if (!capture_ || forward_done_) return;
  const size_t k = capture_->forward_ops();
  const uint64_t sig = capture_->forward_op(path, outputs, taped);
  if (plan_ == nullptr) return;
  candidates_.erase(std::remove_if(candidates_.begin(), candidates_.end(),
                                   [&](const Plan* p) { return p->signatures.size() <= k || p->signatures[k] != sig; }),
                    candidates_.end());
  if (candidates_.empty()) return diverge();
  if (plan_ != candidates_.front()) {
    // Another path of the same prefix: its layout was not the one being served.
    end_layout(/*completed=*/false);
    plan_ = candidates_.front();
  }
  for (int v : plan_->forward_drops[k]) drop(v);
}

void StaticPlanner::drop(int value) {
  std::shared_ptr<TensorInfo> t = capture_->record(value);
  if (!t || !t->resident() || !t->evictable()) return;
  evict_(*t);
  ++stats_.plan_evictions;
}

void StaticPlanner::backward_stage_begins(const ComputePath& path, const std::vector<const TensorInfo*>& saved) {
  if (!capture_) return;
  if (!forward_done_) {
    forward_done_ = true;
    capture_->forward_done();
  }
  capture_->backward_stage(path, saved);
  if (plan_ == nullptr) return;
  if (stage_ >= static_cast<int>(plan_->stage_ops.size()) ||
      plan_->stage_ops[static_cast<size_t>(stage_)] != capture_->forward_index_of(&path)) {
    return diverge();
  }
  const std::vector<int>& list = plan_->schedule.recompute[static_cast<size_t>(stage_)];
  const std::vector<int>& last_use = plan_->early_free[static_cast<size_t>(stage_)];
  const std::vector<int>& frees = plan_->schedule.free_after[static_cast<size_t>(stage_)];
  const schedule::StepGraph& g = plan_->graph;
  for (size_t i = 0; i < list.size(); ++i) {
    const int v = list[i];
    if (std::shared_ptr<TensorInfo> t = capture_->record(v)) {
      holds_[v] = Tensor(t);  // resident from now until the plan frees it
      if (!t->resident()) {
        remat_.regenerate(*t);
        ++stats_.plan_recomputations;
      }
    }
    const bool op_done = i + 1 == list.size() || g.values[static_cast<size_t>(list[i + 1])].producer != g.values[static_cast<size_t>(v)].producer;
    if (!op_done) continue;
    // As schedule::simulate: what the stage frees and does not read goes once the list is done with it.
    for (int w : frees) {
      if (last_use[static_cast<size_t>(w)] >= 0 && last_use[static_cast<size_t>(w)] <= static_cast<int>(i)) {
        holds_.erase(w);
        drop(w);
      }
    }
  }
}

void StaticPlanner::backward_stage_ends() {
  if (!capture_ || plan_ == nullptr) return;
  const size_t s = static_cast<size_t>(stage_++);
  if (s >= plan_->schedule.free_after.size()) return;
  for (int v : plan_->schedule.free_after[s]) {
    holds_.erase(v);
    drop(v);
  }
}

void StaticPlanner::block_begins(int block) {
  if (capture_ && !forward_done_ && block >= 0) block_starts_.push_back(static_cast<int>(capture_->forward_ops()));
}

void StaticPlanner::on_resident(const TensorInfo& t) {
  if (capture_) capture_->on_resident(t);
}

void StaticPlanner::on_dropped(const TensorInfo& t) {
  if (capture_) capture_->on_dropped(t);
}

void StaticPlanner::on_destroyed(const TensorInfo& t) {
  if (capture_) capture_->on_destroyed(t);
}

}  // namespace ht

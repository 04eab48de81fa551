#pragma once
// Static plans for steps that repeat (docs/memory.md). Every step is captured
// (memory/step_capture.h); once a step's op sequence has been seen often enough, a plan is
// computed for it under the budget (schedule/solver.h) and cached by the sequence's hash. While
// a later step matches a cached plan op by op, the plan runs it: it drops what the plan drops
// after its last forward use, recomputes what it recomputes just before the planned backward
// stage, frees what it frees after a stage, and places every block at its planned offset
// (alloc/step_layout.h). The moment the step diverges (another path of a supernet, a new shape)
// the rest of the step runs under DTR, which stays the safety net of planned steps too: if the
// arena is ever short, the allocator still asks the memory manager to make room.

#include "memory/step_capture.h"
#include "runtime/tensor.h"
#include "schedule/schedule.h"
#include "schedule/solver.h"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace ht {

class CpuArena;
class Rematerializer;
class StepLayout;

enum class PlanSource : uint8_t {
  kSolver,    // the cheapest schedule under the budget (schedule::solve)
  kSegments,  // sqrt(n) segments of the model's blocks, as torch's checkpoint_sequential
};

struct StaticPlanOptions {
  PlanSource source = PlanSource::kSolver;
  int sightings_before_planning = 1;  // 1: plan a sequence after its first step; 2: once it repeats
  double solve_time_limit_s = 10;  // 0: the segments heuristic alone (no MIP): the same plan every run
  // Weigh recomputation by the modelled kernel costs (runtime/kernel_cost.h), not the measured
  // ones: with the heuristic alone, the same step gets the same plan on every run.
  bool modeled_costs = false;
  // Bytes of the budget the plan leaves free (rounding of blocks the capture could not see).
  double budget_margin = schedule::kDefaultBudgetMargin;
  bool static_layout = true;  // place blocks at planned offsets (alloc/step_layout.h)
  // Record every step, never plan: the planner's profiled step (launcher/planning/profiler.h),
  // whose graph predicts what a plan would do at any budget.
  bool capture_only = false;
};

// One finished step as a plan is solved from it.
struct CapturedStep {
  schedule::StepGraph graph;
  std::vector<int> block_starts;  // forward op index at which each model block began
  std::vector<uint64_t> signatures;  // per forward op (step_capture.h): what a step must match
  uint64_t sequence_hash = 0;        // of the signatures: the plan cache's key
};

struct StaticPlanStats {
  int64_t plan_hits = 0;      // steps run to their end by a plan
  int64_t plan_diverged = 0;  // steps that began on a plan and left it
  int64_t plans = 0;          // plans made
  int64_t plans_ahead = 0;    // of which made before their first step, from a trace (plan_ahead)
  int64_t unplannable = 0;    // sequences no plan fits (they stay under DTR)
  int64_t plans_outgrown = 0; // plans solved again because the memory outside the step grew past their room
  double plan_solve_ms = 0;   // total time spent making plans
  int64_t plan_evictions = 0;       // values the plans dropped
  int64_t plan_recomputations = 0;  // values the plans recomputed
  int64_t layout_misses = 0;        // blocks not placed at their planned offset
  int64_t layout_footprint = 0;     // the highest arena address the last layout uses
  // The last plan made: its solver, status, predicted cost and peak, and gap to the bound.
  std::string last_solver;
  std::string last_status;
  double last_predicted_ms = 0;
  double last_gap = 0;
  int64_t last_planned_peak = 0;
};

class StaticPlanner {
 public:
  // `evict`: how the plan drops a value (the memory manager's, so that traces and counts see it).
  StaticPlanner(StaticPlanOptions options, CpuArena& arena, Rematerializer& remat,
                std::function<void(TensorInfo&)> evict);
  ~StaticPlanner();

  // Around one micro-batch's forward and backward.
  void begin_step();
  // `completed` false: the step threw; nothing is learnt from it.
  void end_step(bool completed = true);
  bool in_step() const { return capture_ != nullptr; }
  // True while a plan runs the step: the memory manager then leaves eviction to it.
  bool executing() const { return plan_ != nullptr; }

  // The memory manager's hooks, forwarded while in a step.
  void kernel_begins(bool recompute, bool backward);
  void kernel_ends(bool recompute, bool backward);
  void forward_op(const ComputePath& path, const std::vector<Tensor>& outputs, bool taped);
  void backward_stage_begins(const ComputePath& path, const std::vector<const TensorInfo*>& saved);
  void backward_stage_ends();
  void block_begins(int block);
  void on_resident(const TensorInfo& t);
  void on_dropped(const TensorInfo& t);
  void on_destroyed(const TensorInfo& t);

  // A plan for a step not run yet, from its trace on meta tensors (launcher/planning/meta_trace.h):
  // the step's first run is then planned instead of run under DTR, so a budget DTR cannot train
  // its first step in may still train. Weighs the trace's modelled kernel times (a meta kernel's
  // measured time means nothing). Returns false when no plan fits (the step is then planned from
  // its run, as any other) or one exists for the sequence already.
  bool plan_ahead(const CapturedStep& step);

  const StaticPlanStats& stats() const { return stats_; }
  // With capture_only: the last step that completed; null before one has.
  const CapturedStep* last_step() const { return last_step_.get(); }

 private:
  struct Plan;
  // Returns false when no plan fits the budget.
  bool make_plan(uint64_t hash, const schedule::StepGraph& graph, const std::vector<uint64_t>& signatures,
                 const std::vector<int>& block_starts);
  void diverge();
  int64_t plan_budget() const;  // the budget less the margin
  // The step's blocks are no longer placed by the plan: a replay ends, a recording is kept
  // only when `completed` (the plan ran the whole step).
  void end_layout(bool completed);
  void drop(int value);

  StaticPlanOptions options_;
  CpuArena& arena_;
  Rematerializer& remat_;
  std::function<void(TensorInfo&)> evict_;
  std::unique_ptr<StepCapture> capture_;  // the step being run; null between steps
  std::vector<int> block_starts_;         // forward op index at which each block began
  std::map<uint64_t, std::unique_ptr<Plan>> plans_;  // by sequence hash
  std::unordered_map<uint64_t, int> sightings_;
  std::vector<Plan*> candidates_;  // plans whose sequence the step has matched so far
  Plan* plan_ = nullptr;           // the plan running the step
  Plan* layout_plan_ = nullptr;    // the plan whose layout places the step's blocks
  bool forward_done_ = false;
  int stage_ = 0;
  std::unordered_map<int, Tensor> holds_;  // values the plan recomputed, held until it frees them
  StaticPlanStats stats_;
  std::unique_ptr<CapturedStep> last_step_;
};

}  // namespace ht

// The solver: the segments heuristic first (fast, always), then the MIP (mip_model.h) on COIN-OR
// CBC, warm-started from the heuristic's schedule, under the time limit. Every schedule returned
// has been simulated; a MIP solution that does not simulate within the budget is not returned.
//
// Why CBC (2.10.8, C API) and not GLPK (5.0): both were run on the same models, warm-started
// from the same heuristic schedule (GLPK through glp_ios_heur_sol, its continuous columns
// completed by an LP), 10 s limit, on the 2-core CI machine shared with builds, 2026-11-23.
// Graphs of tests/schedule/graphs.h; budgets as fractions of the activation peak; costs in ms of
// recomputation: "opt X in T" proven optimal, else best found / lower bound ("-": none found).
//   graph: ops; columns, binaries, rows       budget  heuristic  CBC               GLPK
//   gpt(1): 23; 506, 450, 581                   0.8     0.90     opt 0.70 in 2.7   opt 0.70 in 4.0
//                                               0.6     6.30     opt 4.50 in 3.8   4.60 / 2.47
//                                               0.5     -        - / 7.33          opt 7.60 in 2.2
//   random_skips(40): 40; 1896, 1772, 2400      0.8     2.46     opt 2.19 in 3.3   opt 2.19 in 2.1
//                                               0.6     7.18     opt 6.73 in 4.7   opt 6.73 in 4.6
//                                               0.5    11.13     10.15 / 9.63      11.06 / 9.66
//   gpt(2): 41; 1491, 1334, 1725                0.8     1.00     opt 1.00 in 7.9   1.00 / 0.86
//                                               0.6     6.00     5.40 / 2.11       6.00 / 1.37
//   resnet(2, 2): 36; 1576, 1390, 1776          0.8     1.55     1.25 / 0.71       1.55 / 0.42
//   ResNet-18, resnet(4, 2): 68; 5756, 5110, 6546  0.5  8.75     8.75 / 3.21       8.75 / 2.37
//   gpt(6): 113; 10531, 9470, 12301             0.8     2.20     opt 2.20 in 1.8   2.20 / 1.54
//                                               0.5    22.0      22.0 / 7.14       22.0 / 4.41
// CBC proves more optima, finds the better schedules where the MIP beats the heuristic, and
// proves tighter bounds (its root cuts); GLPK solved one instance CBC did not (gpt(1) at 0.5,
// where the heuristic had no start to give). Neither improves on the heuristic for ResNet-18 or
// the 6-layer GPT at half their activation peak or less within 10 s: there the answer is the
// heuristic's, with the bound saying how far it may be from the best.
// CBC does not interrupt its root node for the time limit: with the root's LP and cuts a solve
// overran 10 s by up to 6 s on these models, and a 0.05 s limit on 28k columns took 0.9 s.

#include "schedule/solver.h"

#include "schedule/cbc_backend.h"
#include "schedule/mip_model.h"
#include "schedule/needs.h"
#include "schedule/segments.h"

#include <algorithm>
#include <chrono>

namespace ht::schedule {
namespace {

// Costs closer than this are equal: the MIP's objective carries a 1e-6 ms floor per op call.
constexpr double kSameMs = 1e-4;
// Models larger than this go unsolved: the solver's root LP alone, which its time limit does not
// interrupt, would take seconds (about 0.5 s at 28k columns on the CI machine).
constexpr int64_t kMaxMipColumns = 100000;

// The model's columns, about: per value, an S and an R per stage it matters at.
int64_t mip_columns(const detail::Needs& needs) {
  int64_t columns = 0;
  for (int last : needs.last_need) columns += 2 * (last + 1);
  return columns;
}

void set_schedule(SolveResult& result, const Schedule& schedule, const ScheduleCost& cost) {
  result.schedule = schedule;
  result.cost = cost;
  result.objective_ms = cost.recompute_ms;
}

// The heuristic's answer: its cheapest schedule within the budget, else its lowest peak. A
// schedule that recomputes nothing cannot be beaten: optimal without a solver.
SolveResult heuristic_result(const detail::HeuristicResult& h) {
  SolveResult result;
  set_schedule(result, h.best.schedule, h.best.cost);
  result.solver = "segments";
  result.status = !h.fits ? SolveStatus::kInfeasible
                          : h.best.cost.recomputations == 0 ? SolveStatus::kOptimal : SolveStatus::kHeuristic;
  return result;
}

// Runs the MIP and takes its schedule when it simulates within the budget and beats the
// heuristic's (or the heuristic found none). Fills the bound either way.
void run_mip(const StepGraph& graph, const detail::Needs& needs, const detail::HeuristicResult& h,
             const SolveOptions& options, SolveResult& result) {
  detail::MipModel model(graph, needs, options.budget_bytes);
  // Constant bytes alone exceed the budget, or nothing to decide: the heuristic's verdict stands.
  if (model.infeasible() || model.lp().columns() == 0) return;
  const std::vector<double> start = h.start_fits ? model.start_from(h.start.schedule) : std::vector<double>{};
  const detail::MipOutcome outcome = detail::solve_with_cbc(model.lp(), start, options.time_limit_s);
  result.bound_ms = outcome.bound;
  if (!outcome.has_solution) return;
  const Schedule schedule = model.decode(outcome.x);
  const ScheduleCost cost = simulate(graph, schedule);
  if (!cost.valid) return;
  const bool fits = cost.peak_bytes <= options.budget_bytes;
  if (!h.fits) {
    // Nothing fitted before: a fitting MIP schedule wins; otherwise keep the lower peak.
    if (fits || cost.peak_bytes < result.cost.peak_bytes) set_schedule(result, schedule, cost);
    if (fits) {
      result.status = outcome.optimal ? SolveStatus::kOptimal : SolveStatus::kTimeLimit;
      result.solver = "cbc";
    }
    return;
  }
  const double heuristic_ms = h.best.cost.recompute_ms;
  if (!fits || cost.recompute_ms > heuristic_ms + kSameMs) return;
  if (cost.recompute_ms < heuristic_ms - kSameMs || outcome.optimal) {
    set_schedule(result, schedule, cost);
    result.status = outcome.optimal ? SolveStatus::kOptimal : SolveStatus::kTimeLimit;
    result.solver = "cbc";
  }
}

}  // namespace

SolveResult solve(const StepGraph& graph, const SolveOptions& options) {
  const auto began = std::chrono::steady_clock::now();
  const detail::Needs needs = detail::analyze_needs(graph);
  const detail::HeuristicResult h =
      detail::segments_heuristic(graph, needs, options.budget_bytes, detail::mip_budget(options.budget_bytes));
  SolveResult result = heuristic_result(h);
  const bool mip = options.use_mip && detail::mip_solver_built() && static_cast<int64_t>(graph.values.size()) <= options.max_mip_values &&
                   mip_columns(needs) <= kMaxMipColumns;
  if (mip && result.status != SolveStatus::kOptimal) run_mip(graph, needs, h, options, result);
  if (result.status == SolveStatus::kOptimal) result.bound_ms = result.objective_ms;
  // The MIP's bound is its model's; the heuristic can beat a model that is conservative.
  result.bound_ms = std::min(result.bound_ms, result.objective_ms);
  result.gap = result.status == SolveStatus::kOptimal || result.objective_ms <= 0
                   ? 0
                   : (result.objective_ms - result.bound_ms) / std::max(result.objective_ms, 1e-9);
  result.solve_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count();
  return result;
}

const char* solve_status_name(SolveStatus status) {
  switch (status) {
    case SolveStatus::kOptimal: return "optimal";
    case SolveStatus::kTimeLimit: return "time_limit";
    case SolveStatus::kHeuristic: return "heuristic";
    case SolveStatus::kInfeasible: return "infeasible";
  }
  return "unknown";
}

}  // namespace ht::schedule

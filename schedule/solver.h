#pragma once
// Solves for the cheapest schedule under a memory budget: a mixed-integer program (Checkmate's,
// restricted to recomputation in backward) solved by a real MIP solver under a time limit, with
// a fast heuristic (Chen's segments over the forward order) as its starting point and fallback.

#include "schedule/schedule.h"

#include <cstdint>
#include <string>

namespace ht::schedule {

// The share of a budget a plan leaves free, for the rounding of blocks a capture cannot see.
inline constexpr double kDefaultBudgetMargin = 0.03;

struct SolveOptions {
  int64_t budget_bytes = 0;     // the peak (simulate()) must not exceed it
  double time_limit_s = 10;     // wall-clock limit of the MIP solver (its root node is not interrupted)
  int max_mip_values = 4000;    // larger graphs go to the heuristic directly (so do models over 100k columns)
  bool use_mip = true;          // false: the heuristic only
};

enum class SolveStatus {
  kOptimal,     // the MIP solver proved optimality (gap 0), or the schedule recomputes nothing
  kTimeLimit,   // the solver's best schedule when time ran out (gap reported)
  kHeuristic,   // the heuristic's schedule (MIP off, too large, or found nothing better)
  kInfeasible,  // no schedule found fits (the MIP proved none does, or found none in time, or did
                // not run): `schedule` is the lowest peak found, its cost filled
};

struct SolveResult {
  SolveStatus status = SolveStatus::kInfeasible;
  Schedule schedule;
  ScheduleCost cost;            // simulate(graph, schedule)
  double objective_ms = 0;      // predicted recomputation cost of the returned schedule
  // Lower bound on any schedule's cost: the MIP solver's (of its model, which counts memory a
  // little conservatively, so capped at objective_ms); 0 when the MIP did not run.
  double bound_ms = 0;
  double gap = 0;               // (objective - bound) / max(objective, tiny); 0 when optimal or objective 0
  double solve_ms = 0;          // wall-clock time spent solving
  std::string solver;           // "cbc", "glpk", or "segments"
};

// `graph` must be finished. Not reentrant: CBC's driver keeps global state.
SolveResult solve(const StepGraph& graph, const SolveOptions& options);
const char* solve_status_name(SolveStatus status);

}  // namespace ht::schedule

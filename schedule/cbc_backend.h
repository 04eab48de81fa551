#pragma once
// Runs COIN-OR CBC (through its C API) on an LpModel. Private to schedule/. CBC's driver keeps
// global state: calls must not overlap (solve() is not reentrant across threads).

#include "schedule/mip_model.h"

#include <vector>

namespace ht::schedule::detail {

struct MipOutcome {
  bool has_solution = false;  // x holds an integer-feasible point
  bool optimal = false;       // proven optimal
  bool infeasible = false;    // proven to have no solution
  std::vector<double> x;
  double objective = 0;       // of x
  double bound = 0;           // best lower bound the solver proved (0 when it proved none)
};

// Whether this build has CBC (schedule/CMakeLists.txt): without it solve_with_cbc finds nothing.
bool mip_solver_built();

// `start`: a feasible point (its integer columns are used), or empty.
MipOutcome solve_with_cbc(const LpModel& lp, const std::vector<double>& start, double time_limit_s);

}  // namespace ht::schedule::detail

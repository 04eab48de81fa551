#include "schedule/cbc_backend.h"

// A build without COIN-OR CBC (schedule/CMakeLists.txt, HT_REQUIRE_CBC=OFF): the MIP finds
// nothing, so solve() keeps the segments heuristic's schedule and its status says so.

namespace ht::schedule::detail {

bool mip_solver_built() { return false; }

MipOutcome solve_with_cbc(const LpModel&, const std::vector<double>&, double) { return {}; }

}  // namespace ht::schedule::detail

#pragma once
// The fast heuristic: Chen et al.'s segments (2016, "Training deep nets with sublinear memory
// cost") over the forward order, generalized to graphs, plus greedy keeps. It is the MIP's warm
// start and the answer when the MIP is off, too large or finds nothing better. Private to
// schedule/.

#include "schedule/needs.h"
#include "schedule/schedule.h"

#include <cstdint>
#include <vector>

namespace ht::schedule::detail {

struct Evaluated {
  Schedule schedule;
  ScheduleCost cost;
};

// The schedule a keep set implies (keep_schedule.cpp): before each stage, what it reads and is
// not resident is recomputed from its nearest resident ancestors (with the other outputs of
// those op calls that backward reads later, so that no op runs twice); after each stage, every
// value that no later stage reads, nor needs to recompute a missing value, is freed.
// `short_holds` (per value, or empty: none): such a value, once recomputed in backward, is held
// only while the next stage reads it or needs it to recompute one of its reads; a later reader
// recomputes it again. More recomputation (a segment's chain runs again for each of its stages)
// for a lower peak: what a tight budget needs when holding a whole recomputed segment does not
// fit (DTR frees such values under pressure too).
Schedule schedule_for_keep(const StepGraph& graph, const Needs& needs, const std::vector<char>& keep,
                           const std::vector<char>& short_holds = {});

// The bytes over `budget` summed over the forward ops and backward stages of a (valid) schedule
// (recomputations' discarded outputs and early frees aside: simulate() has the exact peak).
int64_t bytes_over(const StepGraph& graph, const Schedule& schedule, int64_t budget);

struct HeuristicResult {
  bool fits = false;        // `best` is within the budget
  Evaluated best;           // the cheapest within the budget; when none fits, the lowest peak found
  bool start_fits = false;  // `start` is within start_budget
  Evaluated start;          // the cheapest within start_budget (the MIP's warm start)
  int evaluated = 0;        // schedules simulated
};

// `start_budget` (at most `budget_bytes`): the budget the MIP's rows enforce, a little lower.
HeuristicResult segments_heuristic(const StepGraph& graph, const Needs& needs, int64_t budget_bytes,
                                   int64_t start_budget);

}  // namespace ht::schedule::detail

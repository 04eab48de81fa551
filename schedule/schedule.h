#pragma once
// A static plan for one step (a schedule): which values to keep through forward, and, for
// every backward stage, which dropped values to recompute before it and which to free after it.
// Checkmate's formulation (Jain et al. 2020) restricted to our engine: forward runs once in
// order; recomputation happens in backward, just before a stage.

#include "schedule/step_graph.h"

#include <cstdint>
#include <string>
#include <vector>

namespace ht::schedule {

struct Schedule {
  std::vector<char> keep;                      // per value: 1 kept through forward, 0 dropped
  std::vector<std::vector<int>> recompute;     // per backward stage: values recomputed before it, in forward order
  std::vector<std::vector<int>> free_after;    // per backward stage: values freed after it
};
// The rules (simulate() is their reference; the runtime executes exactly these):
// - Forward runs each op once, in order. A value is live from its producer on; a dropped one
//   (keep 0; a value that is not droppable is always kept) dies right after its last forward
//   reader, or right after its producer when none reads it. A kept one lives on into backward.
// - Before stage s, recompute[s] runs in list order, which must be forward order (producers
//   non-decreasing). Consecutive entries with one producer are one call of that op; every input
//   of the op must be resident then (kept, not yet freed, or recomputed earlier in the list), and
//   no listed value may be resident already. The listed outputs become resident; the op's other
//   outputs that are not resident exist during the call and are discarded right after it.
// - Stage s then runs: every value it reads must be resident. After it, free_after[s] is freed
//   (each must be resident and droppable; one the stage does not read goes earlier, as soon as
//   the recompute list is done with it: early_free_points). Whatever is never freed stays to the
//   end of the step.
// - Bytes live: during forward op k, fixed + live values + its working bytes; during a
//   recomputation, fixed + resident values + the call's discarded outputs + its working bytes;
//   during stage s, fixed + resident values + the stage's working bytes. The peak is their max.

// What a schedule costs, by the same rules the runtime executes it (simulate()).
struct ScheduleCost {
  bool valid = false;          // every read and every recomputation's inputs are resident
  std::string invalid_reason;  // when not valid: which stage, which value
  double recompute_ms = 0;     // sum of the costs of the forward ops run again
  int64_t recomputations = 0;  // op calls run again
  int64_t peak_bytes = 0;      // highest bytes live (values + working + fixed), forward or backward
  int peak_stage = -1;         // backward stage of the peak; -1: in forward
};

// Within a stage's recompute list, a value the stage frees after it (free_after) and does not
// read is freed as soon as the list no longer reads it: a recomputation chain need not hold all
// of its values at once. Per value: -1 (not freed early), else the list position it is last
// read at; it is freed once the op call at that position has run.
std::vector<int> early_free_points(const StepGraph& graph, const Schedule& schedule, int stage);

ScheduleCost simulate(const StepGraph& graph, const Schedule& schedule);

// Everything backward reads kept, nothing recomputed, each value freed after its last backward
// read: its peak is the step's unbudgeted peak.
Schedule keep_everything(const StepGraph& graph);

}  // namespace ht::schedule

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

// What a schedule costs, by the same rules the runtime executes it (simulate()).
struct ScheduleCost {
  bool valid = false;          // every read and every recomputation's inputs are resident
  std::string invalid_reason;  // when not valid: which stage, which value
  double recompute_ms = 0;     // sum of the costs of the forward ops run again
  int64_t recomputations = 0;  // op calls run again
  int64_t peak_bytes = 0;      // highest bytes live (values + working + fixed), forward or backward
  int peak_stage = -1;         // backward stage of the peak; -1: in forward
};

ScheduleCost simulate(const StepGraph& graph, const Schedule& schedule);

// Everything kept: no recomputation; its peak is the step's unbudgeted peak.
Schedule keep_everything(const StepGraph& graph);

}  // namespace ht::schedule

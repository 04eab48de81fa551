#pragma once
// What both solvers derive first from a step graph: how long into backward each value can
// matter. Private to schedule/.

#include "schedule/step_graph.h"

#include <vector>

namespace ht::schedule::detail {

struct Needs {
  // Per value: the last backward stage that may need it resident, because it reads it or because
  // it may recompute a value whose op reads it. -1: backward never needs it, or it is not
  // droppable (always resident). Past it a value is dead weight; before it, it must be resident
  // or recomputable when needed.
  std::vector<int> last_need;
  // Per value: the last backward stage that reads it, -1: none (last_backward_read, recomputed
  // here so that an unfinished graph works too).
  std::vector<int> last_read;
  // Per value: the backward stages that read it, in order.
  std::vector<std::vector<int>> readers;
  // Per value: the droppable values computed by ops that read it (recomputing them needs it).
  std::vector<std::vector<int>> dependents;
};

Needs analyze_needs(const StepGraph& graph);

// The point after which forward frees a dropped value: its last forward reader, else its producer.
inline int forward_death(const Value& v) { return v.last_forward_use >= 0 ? v.last_forward_use : v.producer; }

}  // namespace ht::schedule::detail

#pragma once
// One training step as the interpreter ran it, as plain data: the forward op calls in order,
// then the backward stages (tape entries) in order. This is all a static plan is computed from
// (memory/static_plan.h builds it from the recorded step); nothing here knows tensors.

#include <cstdint>
#include <vector>

namespace ht::schedule {

// A value the plan may keep or drop: the data of one output of a forward op call.
struct Value {
  int64_t bytes = 0;      // arena bytes (rounded to the arena's blocks)
  int producer = -1;      // index of the forward op that computes it
  bool droppable = true;  // false: never dropped (its op is not recomputable, or a user holds it)
  // Index of the last forward op that reads it; -1 when no forward op reads it. A dropped value
  // is freed right after it (or right after its producer when no forward op reads it).
  int last_forward_use = -1;
};

struct ForwardOp {
  double cost_ms = 0;        // measured kernel time: what recomputing it costs
  double modeled_ms = 0;     // runtime/kernel_cost.h's model of it: the same on every run
  std::vector<int> inputs;   // values it reads (leaves, always resident, are not listed)
  std::vector<int> outputs;  // values it computes
  int64_t working_bytes = 0; // temporaries beyond its inputs and outputs while it runs
};

struct BackwardStage {
  int forward_op = -1;           // the forward op whose backward this is
  std::vector<int> reads;        // values its backward reads (they must be resident)
  int64_t working_bytes = 0;     // gradients and temporaries live while it runs, beyond values
};

struct StepGraph {
  std::vector<Value> values;
  std::vector<ForwardOp> forward;       // in execution order
  std::vector<BackwardStage> backward;  // in execution order
  // Index of the last backward stage that reads each value (-1: none), filled by finish().
  std::vector<int> last_backward_read;
  // Bytes no plan moves (inputs, gradients accumulating, values of other steps).
  int64_t fixed_bytes = 0;

  // Fills derived fields (last_backward_read) and checks indices; throws std::invalid_argument.
  void finish();
};

// The same graph with every op's cost its modelled one: what a plan weighs under
// memory.kernel_costs = "modeled", so that the same step gets the same plan on every run, loaded
// machine or idle. Simulate the chosen schedule on the measured graph for its time.
StepGraph weighed_by_model(StepGraph graph);

}  // namespace ht::schedule

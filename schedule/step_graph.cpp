#include "schedule/step_graph.h"

#include <stdexcept>
#include <string>

namespace ht::schedule {
namespace {

[[noreturn]] void bad(const std::string& what) { throw std::invalid_argument("StepGraph: " + what); }

void check_index(int index, size_t size, const std::string& what) {
  if (index < 0 || static_cast<size_t>(index) >= size)
    bad(what + " " + std::to_string(index) + " out of range [0, " + std::to_string(size) + ")");
}

// Every value has one producer that lists it among its outputs, and every input was computed by
// an earlier op: the simulator and the solver walk the forward order and rely on both.
void check_forward(const StepGraph& g) {
  const size_t n = g.values.size();
  std::vector<int> listed_by(n, -1);
  for (size_t k = 0; k < g.forward.size(); ++k) {
    const ForwardOp& op = g.forward[k];
    const std::string where = "forward op " + std::to_string(k);
    if (op.working_bytes < 0 || op.cost_ms < 0) bad(where + ": negative working bytes or cost");
    for (int v : op.outputs) {
      check_index(v, n, where + ": output value");
      if (listed_by[v] != -1) bad(where + ": value " + std::to_string(v) + " is output twice");
      if (g.values[v].producer != static_cast<int>(k))
        bad(where + ": outputs value " + std::to_string(v) + " whose producer is " +
            std::to_string(g.values[v].producer));
      listed_by[v] = static_cast<int>(k);
    }
    for (int v : op.inputs) {
      check_index(v, n, where + ": input value");
      if (g.values[v].producer >= static_cast<int>(k))
        bad(where + ": reads value " + std::to_string(v) + " computed by op " + std::to_string(g.values[v].producer));
      if (g.values[v].last_forward_use < static_cast<int>(k))
        bad(where + ": reads value " + std::to_string(v) + " after its last_forward_use " +
            std::to_string(g.values[v].last_forward_use));
    }
  }
  for (size_t v = 0; v < n; ++v) {
    const Value& value = g.values[v];
    const std::string where = "value " + std::to_string(v);
    if (value.bytes < 0) bad(where + ": negative bytes");
    check_index(value.producer, g.forward.size(), where + ": producer");
    if (listed_by[v] != value.producer) bad(where + ": not among the outputs of its producer");
    if (value.last_forward_use != -1 &&
        (value.last_forward_use <= value.producer || value.last_forward_use >= static_cast<int>(g.forward.size())))
      bad(where + ": last_forward_use " + std::to_string(value.last_forward_use) + " not after its producer " +
          std::to_string(value.producer) + " and inside forward");
  }
}

}  // namespace

void StepGraph::finish() {
  if (fixed_bytes < 0) bad("negative fixed_bytes");
  check_forward(*this);
  last_backward_read.assign(values.size(), -1);
  for (size_t s = 0; s < backward.size(); ++s) {
    const BackwardStage& stage = backward[s];
    const std::string where = "backward stage " + std::to_string(s);
    check_index(stage.forward_op, forward.size(), where + ": forward_op");
    if (stage.working_bytes < 0) bad(where + ": negative working bytes");
    for (int v : stage.reads) {
      check_index(v, values.size(), where + ": read value");
      last_backward_read[v] = static_cast<int>(s);
    }
  }
}

StepGraph weighed_by_model(StepGraph graph) {
  for (ForwardOp& op : graph.forward) op.cost_ms = op.modeled_ms;
  return graph;
}

}  // namespace ht::schedule

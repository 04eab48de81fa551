#include "schedule/needs.h"

#include <algorithm>

namespace ht::schedule::detail {

Needs analyze_needs(const StepGraph& graph) {
  const size_t n = graph.values.size();
  Needs out;
  out.last_need.assign(n, -1);
  out.last_read.assign(n, -1);
  out.dependents.assign(n, {});
  out.readers.assign(n, {});
  for (size_t s = 0; s < graph.backward.size(); ++s) {
    for (int v : graph.backward[s].reads) {
      if (out.readers[v].empty() || out.readers[v].back() != static_cast<int>(s)) out.readers[v].push_back(static_cast<int>(s));
      out.last_read[v] = static_cast<int>(s);
      if (graph.values[v].droppable) out.last_need[v] = static_cast<int>(s);
    }
  }
  for (const ForwardOp& op : graph.forward) {
    for (int u : op.inputs) {
      for (int w : op.outputs) {
        if (graph.values[w].droppable) out.dependents[u].push_back(w);
      }
    }
  }
  for (auto& d : out.dependents) {
    std::sort(d.begin(), d.end());
    d.erase(std::unique(d.begin(), d.end()), d.end());
  }
  // Dependents come from later ops: walking ops backwards settles them before their inputs.
  for (size_t k = graph.forward.size(); k-- > 0;) {
    for (int v : graph.forward[k].outputs) {
      if (!graph.values[v].droppable) continue;
      for (int w : out.dependents[v]) out.last_need[v] = std::max(out.last_need[v], out.last_need[w]);
    }
  }
  return out;
}

}  // namespace ht::schedule::detail

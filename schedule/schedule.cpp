#include "schedule/schedule.h"

#include <string>

namespace ht::schedule {
namespace {

// Runs a schedule by the rules the runtime executes (schedule.h): the first broken rule ends the
// walk with its reason; until then bytes, costs and the peak accumulate.
class Simulation {
 public:
  Simulation(const StepGraph& graph, const Schedule& schedule)
      : g_(graph), s_(schedule), resident_(graph.values.size(), 0) {}

  ScheduleCost run() {
    if (!check_shape()) return cost_;
    live_ = g_.fixed_bytes;
    forward();
    for (size_t s = 0; s < g_.backward.size(); ++s) {
      if (!recompute(static_cast<int>(s)) || !stage(static_cast<int>(s)) || !free(static_cast<int>(s)))
        return cost_;
    }
    cost_.valid = true;
    return cost_;
  }

 private:
  bool fail(const std::string& reason) {
    cost_.invalid_reason = reason;
    return false;
  }
  // "stage S: <what> value V<why>", built only when a rule is broken.
  bool fail(int stage, const char* what, int value, const char* why) {
    return fail("stage " + std::to_string(stage) + ": " + what + " value " + std::to_string(value) + why);
  }
  void observe(int64_t bytes, int stage) {
    if (bytes > cost_.peak_bytes) {
      cost_.peak_bytes = bytes;
      cost_.peak_stage = stage;
    }
  }
  bool kept(int v) const { return !g_.values[v].droppable || s_.keep[v] != 0; }
  void make_resident(int v) {
    resident_[v] = 1;
    live_ += g_.values[v].bytes;
  }

  bool check_shape() {
    const size_t n = g_.values.size(), stages = g_.backward.size();
    if (s_.keep.size() != n) return fail("keep has " + std::to_string(s_.keep.size()) + " entries for " +
                                         std::to_string(n) + " values");
    if (s_.recompute.size() != stages || s_.free_after.size() != stages)
      return fail("recompute and free_after need one list per backward stage (" + std::to_string(stages) + ")");
    for (size_t s = 0; s < stages; ++s) {
      for (const auto* list : {&s_.recompute[s], &s_.free_after[s]}) {
        for (int v : *list) {
          if (v < 0 || static_cast<size_t>(v) >= n)
            return fail("stage " + std::to_string(s) + ": value " + std::to_string(v) + " out of range");
        }
      }
    }
    return true;
  }

  // A dropped value dies right after its last forward reader (or its producer when none reads it).
  void forward() {
    std::vector<std::vector<int>> dies_after(g_.forward.size());
    for (size_t v = 0; v < g_.values.size(); ++v) {
      const Value& value = g_.values[v];
      if (!kept(static_cast<int>(v)))
        dies_after[value.last_forward_use >= 0 ? value.last_forward_use : value.producer].push_back(
            static_cast<int>(v));
    }
    for (size_t k = 0; k < g_.forward.size(); ++k) {
      for (int v : g_.forward[k].outputs) make_resident(v);
      observe(live_ + g_.forward[k].working_bytes, -1);
      for (int v : dies_after[k]) {
        resident_[v] = 0;
        live_ -= g_.values[v].bytes;
      }
    }
  }

  // The list runs in forward order; consecutive entries of one op are one call of it. Outputs of
  // the op that are neither resident nor listed exist while it runs and are discarded after.
  bool recompute(int s) {
    const std::vector<int>& list = s_.recompute[s];
    const std::vector<int> last_use = early_free_points(g_, s_, s);
    int previous = -1;
    for (size_t i = 0; i < list.size();) {
      const int p = g_.values[list[i]].producer;
      if (p < previous) return fail(s, "recomputes", list[i], " out of forward order");
      previous = p;
      const ForwardOp& op = g_.forward[p];
      for (int u : op.inputs) {
        if (!resident_[u])
          return fail("stage " + std::to_string(s) + ": recomputing value " + std::to_string(list[i]) +
                      " needs value " + std::to_string(u) + ", not resident");
      }
      for (; i < list.size() && g_.values[list[i]].producer == p; ++i) {
        if (resident_[list[i]]) return fail(s, "recomputes", list[i], ", already resident");
        make_resident(list[i]);
      }
      int64_t transient = 0;
      for (int w : op.outputs) transient += resident_[w] ? 0 : g_.values[w].bytes;
      observe(live_ + transient + op.working_bytes, s);
      cost_.recompute_ms += op.cost_ms;
      ++cost_.recomputations;
      // What the stage frees and does not read goes as soon as the list no longer needs it.
      for (int v : s_.free_after[s]) {
        if (resident_[v] && last_use[v] >= 0 && last_use[v] < static_cast<int>(i)) {
          resident_[v] = 0;
          live_ -= g_.values[v].bytes;
          freed_early_[v] = 1;
        }
      }
    }
    return true;
  }

  bool stage(int s) {
    for (int v : g_.backward[s].reads) {
      if (!resident_[v]) return fail(s, "reads", v, ", not resident");
    }
    observe(live_ + g_.backward[s].working_bytes, s);
    return true;
  }

  bool free(int s) {
    for (int v : s_.free_after[s]) {
      if (!g_.values[v].droppable) return fail(s, "frees", v, ", which is not droppable");
      if (freed_early_[v]) {
        freed_early_[v] = 0;
        continue;
      }
      if (!resident_[v]) return fail(s, "frees", v, ", not resident");
      resident_[v] = 0;
      live_ -= g_.values[v].bytes;
    }
    return true;
  }

  const StepGraph& g_;
  const Schedule& s_;
  std::vector<char> resident_;
  std::vector<char> freed_early_ = std::vector<char>(g_.values.size(), 0);
  int64_t live_ = 0;
  ScheduleCost cost_;
};

}  // namespace

std::vector<int> early_free_points(const StepGraph& graph, const Schedule& schedule, int stage) {
  // Per value: -1 unless the stage frees it and does not read it; then the position in the
  // stage's recompute list after which nothing in the list reads it (0 when nothing does).
  std::vector<int> last(graph.values.size(), -1);
  const auto s = static_cast<size_t>(stage);
  for (int v : schedule.free_after[s]) last[static_cast<size_t>(v)] = 0;
  for (int v : graph.backward[s].reads) last[static_cast<size_t>(v)] = -1;
  const std::vector<int>& list = schedule.recompute[s];
  for (size_t i = 0; i < list.size(); ++i) {
    for (int u : graph.forward[static_cast<size_t>(graph.values[static_cast<size_t>(list[i])].producer)].inputs) {
      if (last[static_cast<size_t>(u)] >= 0) last[static_cast<size_t>(u)] = static_cast<int>(i);
    }
  }
  return last;
}

ScheduleCost simulate(const StepGraph& graph, const Schedule& schedule) { return Simulation(graph, schedule).run(); }

Schedule keep_everything(const StepGraph& graph) {
  Schedule out;
  out.keep.assign(graph.values.size(), 0);
  out.recompute.assign(graph.backward.size(), {});
  out.free_after.assign(graph.backward.size(), {});
  // Computed here rather than taken from last_backward_read so that an unfinished graph works too.
  std::vector<int> last_read(graph.values.size(), -1);
  for (size_t s = 0; s < graph.backward.size(); ++s) {
    for (int v : graph.backward[s].reads) last_read[v] = static_cast<int>(s);
  }
  for (size_t v = 0; v < graph.values.size(); ++v) {
    if (!graph.values[v].droppable) {
      out.keep[v] = 1;
    } else if (last_read[v] >= 0) {
      out.keep[v] = 1;
      out.free_after[last_read[v]].push_back(static_cast<int>(v));
    }
  }
  return out;
}

}  // namespace ht::schedule

// The schedule a keep set implies (segments.h): what each stage reads is recomputed on demand
// from the nearest resident ancestors, and a value is freed after the first stage past which
// nothing needs it (one held short, once recomputed, after the first stage past which the next
// stage does not need it).
#include "schedule/segments.h"

#include <algorithm>

namespace ht::schedule::detail {
namespace {

class KeepScheduler {
 public:
  KeepScheduler(const StepGraph& graph, const Needs& needs, const std::vector<char>& short_holds)
      : g_(graph), needs_(needs), short_holds_(short_holds), resident_(graph.values.size(), 0),
        recomputed_(graph.values.size(), 0), stamp_(graph.values.size(), -1), memo_(graph.values.size(), 0),
        op_seen_(graph.forward.size(), -1) {
    if (!short_holds.empty()) cursor_.assign(graph.values.size(), 0);
  }

  Schedule run(const std::vector<char>& keep) {
    const size_t n = g_.values.size(), stages = g_.backward.size();
    Schedule out;
    out.keep.assign(n, 0);
    out.recompute.assign(stages, {});
    out.free_after.assign(stages, {});
    for (size_t v = 0; v < n; ++v) {
      // A value backward never needs is not worth keeping, whatever the caller asked.
      out.keep[v] = resident_[v] = !g_.values[v].droppable || (keep[v] && needs_.last_need[v] >= 0);
      if (g_.values[v].droppable && resident_[v]) live_.push_back(static_cast<int>(v));
    }
    for (size_t s = 0; s < stages; ++s) {
      recompute_for(static_cast<int>(s), out.recompute[s]);
      free_after(static_cast<int>(s), out.free_after[s]);
    }
    return out;
  }

 private:
  // Runs again the ops of the stage's missing reads and, recursively, of their missing inputs;
  // an op run also yields its other missing outputs that backward reads from here on, so that it
  // does not run twice. The list is put in forward order.
  void recompute_for(int s, std::vector<int>& list) {
    for (int r : g_.backward[s].reads) pending_.push_back(r);
    auto add = [&](int v) {
      resident_[v] = 1;
      recomputed_[v] = 1;
      list.push_back(v);
      live_.push_back(v);
    };
    while (!pending_.empty()) {
      const int x = pending_.back();
      pending_.pop_back();
      if (resident_[x]) continue;
      add(x);
      const int p = g_.values[x].producer;
      if (op_seen_[p] == s) continue;
      op_seen_[p] = s;
      for (int w : g_.forward[p].outputs) {
        if (!resident_[w] && needs_.last_read[w] >= s) add(w);
      }
      for (int u : g_.forward[p].inputs) pending_.push_back(u);
    }
    std::sort(list.begin(), list.end(), [&](int a, int b) {
      const int pa = g_.values[a].producer, pb = g_.values[b].producer;
      return pa != pb ? pa < pb : a < b;
    });
  }

  void free_after(int s, std::vector<int>& freed) {
    // First the recomputed values held short that the next stage does not need, then, with them
    // gone, whatever no later stage needs.
    if (!short_holds_.empty()) {
      free_unless(freed, [&](int v) { return !recomputed_[v] || !short_holds_[v] || needed_next(v, s); });
    }
    free_unless(freed, [&](int v) { return needed_later(v, s); });
  }

  // Moves the live values `keep` rejects to `freed`; one memo pass.
  template <typename Keep>
  void free_unless(std::vector<int>& freed, const Keep& keep) {
    ++pass_;
    size_t kept = 0;
    const size_t first = freed.size();
    for (int v : live_) {
      if (keep(v)) {
        live_[kept++] = v;
      } else {
        freed.push_back(v);
      }
    }
    live_.resize(kept);
    for (size_t i = first; i < freed.size(); ++i) resident_[freed[i]] = 0;
  }

  // Whether stage s + 1 reads v, or recomputes for one of its reads a value that is not resident
  // and whose op reads v.
  bool needed_next(int v, int s) {
    return needed(v, s, [&](int x) {
      const std::vector<int>& stages = needs_.readers[x];
      size_t& c = cursor_[x];
      while (c < stages.size() && stages[c] <= s) ++c;
      return c < stages.size() && stages[c] == s + 1;
    });
  }

  // Whether a stage after s reads v, or recomputes for such a read a value that is not resident
  // and whose op reads v.
  bool needed_later(int v, int s) {
    return needed(v, s, [&](int x) { return needs_.last_read[x] > s; });
  }

  // Whether `read(v)` (a stage that counts reads v) or, recursively, a value not resident whose op
  // reads v is needed so. Memoized per pass; dependents come from later ops, so no cycle.
  template <typename Read>
  bool needed(int v, int s, const Read& read) {
    if (needs_.last_need[v] <= s) return false;
    if (read(v)) return true;
    if (stamp_[v] == pass_) return memo_[v];
    bool found = false;
    for (int w : needs_.dependents[v]) {
      if (!resident_[w] && needed(w, s, read)) {
        found = true;
        break;
      }
    }
    stamp_[v] = pass_;
    memo_[v] = found;
    return found;
  }

  const StepGraph& g_;
  const Needs& needs_;
  const std::vector<char>& short_holds_;  // per value, or empty
  std::vector<char> resident_;
  std::vector<char> recomputed_;  // made resident by a recomputation (not kept through forward)
  std::vector<int> live_;  // droppable values resident
  std::vector<size_t> cursor_;  // short holds, per value: its first reader (needs_.readers) after the stage freed after
  int pass_ = 0;                           // memo stamp: one per decision pass
  std::vector<int> stamp_;
  std::vector<char> memo_;
  std::vector<int> op_seen_, pending_;
};

}  // namespace

Schedule schedule_for_keep(const StepGraph& graph, const Needs& needs, const std::vector<char>& keep,
                           const std::vector<char>& short_holds) {
  return KeepScheduler(graph, needs, short_holds).run(keep);
}

int64_t bytes_over(const StepGraph& graph, const Schedule& schedule, int64_t budget) {
  std::vector<std::vector<int>> dies_after(graph.forward.size());
  for (size_t v = 0; v < graph.values.size(); ++v) {
    const Value& value = graph.values[v];
    if (value.droppable && !schedule.keep[v]) dies_after[forward_death(value)].push_back(static_cast<int>(v));
  }
  int64_t live = graph.fixed_bytes, over = 0;
  for (size_t k = 0; k < graph.forward.size(); ++k) {
    for (int v : graph.forward[k].outputs) live += graph.values[v].bytes;
    over += std::max<int64_t>(0, live + graph.forward[k].working_bytes - budget);
    for (int v : dies_after[k]) live -= graph.values[v].bytes;
  }
  for (size_t s = 0; s < graph.backward.size(); ++s) {
    for (int v : schedule.recompute[s]) live += graph.values[v].bytes;
    over += std::max<int64_t>(0, live + graph.backward[s].working_bytes - budget);
    for (int v : schedule.free_after[s]) live -= graph.values[v].bytes;
  }
  return over;
}

}  // namespace ht::schedule::detail

// The heuristic's search over keep sets: Chen's segments and cost-per-byte prefixes as seeds, a
// greedy descent from keeping everything, then single changes while they help. Every keep set is
// judged by simulating the schedule it implies.
#include "schedule/segments.h"

#include <algorithm>
#include <numeric>

namespace ht::schedule::detail {
namespace {

// Ranks a drop: bytes off the peak per ms of recomputation added (1 us at least).
constexpr double kMinAddedMs = 1e-3;
// Rounds of single changes once a keep set fits.
constexpr int kImprovePasses = 2;
// Weight of bytes over budget summed over ops and stages against bytes off the peak.
constexpr double kOverWeight = 1e-3;
// Segment counts tried: every one up to this, then 25% apart.
constexpr int kEverySegmentCount = 24;

class Search {
 public:
  Search(const StepGraph& graph, const Needs& needs, int64_t budget, int64_t start_budget)
      : g_(graph), needs_(needs), budget_(budget), start_budget_(start_budget) {
    for (size_t v = 0; v < graph.values.size(); ++v) {
      if (graph.values[v].droppable && needs.last_need[v] >= 0) needed_.push_back(static_cast<int>(v));
    }
    // Most recompute time saved per byte kept first.
    by_ratio_ = needed_;
    std::stable_sort(by_ratio_.begin(), by_ratio_.end(), [&](int a, int b) { return ratio(a) > ratio(b); });
  }

  HeuristicResult run() {
    search();
    // Holding what backward recomputes until its last reader does not fit: the same search with
    // recomputed values held only for the next stage (schedule_for_keep's short holds), the
    // cheapest to recompute per byte first: a quarter of them, half, three quarters, all.
    for (int quarter = 1; quarter <= 4 && !fits_; ++quarter) {
      short_holds_.assign(g_.values.size(), 0);
      for (size_t i = by_ratio_.size() * (4 - quarter) / 4; i < by_ratio_.size(); ++i) short_holds_[by_ratio_[i]] = 1;
      search();
    }
    HeuristicResult out;
    out.fits = fits_;
    out.best = fits_ ? best_ : lowest_;
    out.start_fits = start_fits_;
    out.start = start_;
    out.evaluated = evaluated_;
    return out;
  }

 private:
  void search() {
    for (int f = 0; f <= 20; ++f) evaluate(prefix(by_ratio_.size() * f / 20));
    const int ops = static_cast<int>(g_.forward.size());
    for (int k = 1; k <= ops; k = k < kEverySegmentCount ? k + 1 : k + k / 4) {
      evaluate(cut_keep(boundaries_by_ops(k)));
      evaluate(cut_keep(boundaries_by_bytes(k)));
    }
    descend();
    if (!fits_) reduce_peak();
    if (fits_) improve();
  }

  double ratio(int v) const {
    return g_.forward[g_.values[v].producer].cost_ms / static_cast<double>(std::max<int64_t>(g_.values[v].bytes, 1));
  }

  std::vector<char> prefix(size_t count) const {
    std::vector<char> keep(g_.values.size(), 0);
    for (size_t i = 0; i < count; ++i) keep[by_ratio_[i]] = 1;
    return keep;
  }

  std::vector<int> boundaries_by_ops(int k) const {
    std::vector<int> b;
    const int ops = static_cast<int>(g_.forward.size());
    for (int j = 1; j < k; ++j) b.push_back(static_cast<int>(static_cast<int64_t>(j) * ops / k));
    b.erase(std::unique(b.begin(), b.end()), b.end());
    return b;
  }

  // Boundaries that split the bytes backward needs into k equal parts.
  std::vector<int> boundaries_by_bytes(int k) const {
    std::vector<double> per_op(g_.forward.size(), 0);
    for (int v : needed_) per_op[g_.values[v].producer] += static_cast<double>(g_.values[v].bytes);
    const double total = std::accumulate(per_op.begin(), per_op.end(), 0.0);
    std::vector<int> b;
    double sum = 0;
    int j = 1;
    for (size_t op = 0; op < per_op.size() && j < k; ++op) {
      sum += per_op[op];
      if (sum >= total * j / k) {
        if (b.empty() || b.back() != static_cast<int>(op) + 1) b.push_back(static_cast<int>(op) + 1);
        ++j;
      }
    }
    return b;
  }

  // Checkpoints at boundaries: every needed value that a forward op past a boundary reads from
  // before it. From them backward recomputes one segment at a time.
  std::vector<char> cut_keep(const std::vector<int>& boundaries) const {
    std::vector<char> keep(g_.values.size(), 0);
    for (int v : needed_) {
      const Value& value = g_.values[v];
      auto it = std::upper_bound(boundaries.begin(), boundaries.end(), value.producer);
      keep[v] = it != boundaries.end() && *it <= value.last_forward_use;
    }
    return keep;
  }

  Evaluated evaluate(const std::vector<char>& keep) {
    Evaluated e;
    e.schedule = schedule_for_keep(g_, needs_, keep, short_holds_);
    e.cost = simulate(g_, e.schedule);
    ++evaluated_;
    if (!e.cost.valid) return e;  // cannot happen by construction; never returned if it does
    if (e.cost.peak_bytes <= start_budget_ && (!start_fits_ || better(e.cost, start_.cost))) {
      start_fits_ = true;
      start_ = e;
    }
    if (e.cost.peak_bytes <= budget_) {
      if (!fits_ || better(e.cost, best_.cost)) {
        fits_ = true;
        best_ = e;
      }
    } else if (!lowest_.cost.valid || e.cost.peak_bytes < lowest_.cost.peak_bytes) {
      lowest_ = e;
    }
    return e;
  }

  static bool better(const ScheduleCost& a, const ScheduleCost& b) {
    if (a.recompute_ms != b.recompute_ms) return a.recompute_ms < b.recompute_ms;
    return a.peak_bytes < b.peak_bytes;
  }

  // From keeping everything backward needs, drop the kept value that helps most (score_drop)
  // until the schedule fits. Lazily (Minoux's accelerated greedy): a drop's score is recomputed
  // only when it tops the queue, as scores mostly fall as more is dropped; when none helps any
  // more, every score is recomputed once before giving up.
  void descend() {
    Evaluated current = evaluate(prefix(by_ratio_.size()));
    int64_t over = bytes_over(g_, current.schedule, budget_);
    std::vector<std::pair<double, int>> queue;  // (score, value), a heap
    bool fresh = false;                          // every score in the queue is current
    while (current.cost.valid && current.cost.peak_bytes > budget_) {
      if (queue.empty() || (queue.front().first <= 0 && !fresh)) {
        queue.clear();
        for (int v : needed_) {
          if (current.schedule.keep[v]) queue.push_back({score_drop(current, over, v, nullptr), v});
        }
        std::make_heap(queue.begin(), queue.end());
        fresh = true;
      }
      if (queue.empty() || queue.front().first <= 0) return;  // no single drop helps
      std::pop_heap(queue.begin(), queue.end());
      const int v = queue.back().second;
      queue.pop_back();
      Evaluated next;
      const double score = score_drop(current, over, v, &next);
      if (score > 0 && (queue.empty() || score >= queue.front().first)) {
        current = std::move(next);
        over = bytes_over(g_, current.schedule, budget_);
        fresh = false;
      } else {
        queue.push_back({score, v});
        std::push_heap(queue.begin(), queue.end());
      }
    }
  }

  // How much dropping v helps, per ms it adds: bytes off the peak, and a little for bytes over
  // budget summed over every op and stage (`over` before), so that a plateau of equal peaks
  // still shows progress. Leaves the schedule in `out` when given.
  double score_drop(const Evaluated& current, int64_t over, int v, Evaluated* out) {
    std::vector<char> keep = current.schedule.keep;
    keep[v] = 0;
    Evaluated e = evaluate(keep);
    if (!e.cost.valid) return -1;
    const double gain = static_cast<double>(current.cost.peak_bytes - e.cost.peak_bytes) +
                        kOverWeight * static_cast<double>(over - bytes_over(g_, e.schedule, budget_));
    const double score = gain / std::max(e.cost.recompute_ms - current.cost.recompute_ms, kMinAddedMs);
    if (out != nullptr) *out = std::move(e);
    return score;
  }

  // Single changes from the cheapest fitting keep set while one makes it cheaper: keep a
  // dropped value, most time saved per byte first.
  void improve() {
    for (int pass = 0; pass < kImprovePasses; ++pass) {
      const double before = best_.cost.recompute_ms;
      for (int v : by_ratio_) {
        if (best_.schedule.keep[v]) continue;
        std::vector<char> keep = best_.schedule.keep;
        keep[v] = 1;
        evaluate(keep);
      }
      if (best_.cost.recompute_ms >= before) return;
    }
  }

  // Nothing fits: from the lowest peak found, drop or keep single values while the peak falls
  // (dropping saves forward memory, keeping shortens what backward recomputes at once).
  void reduce_peak() {
    for (int v : needed_) {
      if (fits_) return;
      std::vector<char> keep = lowest_.schedule.keep;
      keep[v] = !keep[v];
      evaluate(keep);
    }
  }

  const StepGraph& g_;
  const Needs& needs_;
  const int64_t budget_, start_budget_;
  std::vector<int> needed_, by_ratio_;
  bool fits_ = false, start_fits_ = false;
  std::vector<char> short_holds_;  // per value, or empty (schedule_for_keep)
  Evaluated best_, lowest_, start_;  // the cheapest within each budget; the lowest peak over it
  int evaluated_ = 0;
};

}  // namespace

HeuristicResult segments_heuristic(const StepGraph& graph, const Needs& needs, int64_t budget_bytes,
                                   int64_t start_budget) {
  return Search(graph, needs, budget_bytes, start_budget).run();
}

}  // namespace ht::schedule::detail

#pragma once
// What eviction weighs, defined once: the heuristics' scores, the floor under a kernel's cost,
// DTR's evicted neighbourhood (e*), the paper's ignore-small rule and the choice of the victim.
// The engine's policies (memory/eviction_policy.cpp, over tensor records) and the planner's
// offline replay of a step (planner/dtr_replay.cpp, over a recorded trace) both call these, so a
// prediction cannot drift from what the engine does. Plain C++: no tensors, no records; each
// side describes its graph through the small interfaces below.

#include "base/choice.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

namespace ht {

enum class EvictionHeuristic : uint8_t { kDtr, kDtrEq, kMegEngine, kLru, kLargest };
template <>
struct ChoiceNames<EvictionHeuristic> {
  static constexpr std::pair<EvictionHeuristic, const char*> table[] = {
      {EvictionHeuristic::kDtr, "dtr"}, {EvictionHeuristic::kDtrEq, "dtr_eq"},
      {EvictionHeuristic::kMegEngine, "megengine"}, {EvictionHeuristic::kLru, "lru"},
      {EvictionHeuristic::kLargest, "largest"}};
};

// Whether the heuristic weighs recomputation costs (memory.kernel_costs): all but the baselines.
inline bool weighs_costs(EvictionHeuristic h) { return h != EvictionHeuristic::kLru && h != EvictionHeuristic::kLargest; }

// A kernel timed at 0 (a view, a tiny op) still costs something to regenerate; without a floor
// every such tensor would score 0 and be evicted first however often it comes back.
constexpr double kMinCostMs = 1e-6;
// megengine: a tensor evicted and regenerated k times scores kRecomputePenalty^k higher.
constexpr double kRecomputePenalty = 1.25;
// DTR's e* counts at most this many producing op calls (a long evicted chain costs no more to walk).
constexpr int kNeighbourhoodLimit = 256;

inline double regeneration_cost(double kernel_ms) { return std::max(kernel_ms, kMinCostMs); }

// What a heuristic knows of a resident candidate when it scores it.
struct EvictionCandidate {
  double cost_ms = 0;          // regeneration_cost of its producer
  double neighbourhood_ms = 0;  // what evicting it adds to regenerating evicted neighbours: e* (dtr),
                                // their union-find classes (dtr_eq), the one-hop ones (megengine)
  int64_t bytes = 0;
  uint64_t last_access = 0;     // the interpreter's clock (runtime/interpreter.h: one tick per kernel)
  int64_t free_neighbour_bytes = 0;  // megengine: free memory on either side of its block
  uint32_t recompute_count = 0;      // megengine: times it was regenerated
};

// Lower is evicted first.
//   dtr, dtr_eq  (c + e*) / (m * s): cost over bytes m times staleness s (Kirisame et al. 2021);
//   megengine    the same over m plus the free bytes beside the block, times 1.25^recomputations;
//   lru          least recently used first;   largest  largest first.
inline double eviction_score(EvictionHeuristic h, const EvictionCandidate& c, uint64_t now) {
  const double staleness = static_cast<double>(now > c.last_access ? now - c.last_access : 0) + 1.0;
  const double bytes = static_cast<double>(std::max<int64_t>(c.bytes, 1));
  switch (h) {
    case EvictionHeuristic::kLru: return -staleness;
    case EvictionHeuristic::kLargest: return -bytes;
    case EvictionHeuristic::kMegEngine:
      return (c.cost_ms + c.neighbourhood_ms) * std::pow(kRecomputePenalty, c.recompute_count) /
             ((bytes + static_cast<double>(c.free_neighbour_bytes)) * staleness);
    case EvictionHeuristic::kDtr:
    case EvictionHeuristic::kDtrEq: break;
  }
  return (c.cost_ms + c.neighbourhood_ms) / (bytes * staleness);
}

// DTR's e*: the regeneration cost of the evicted component around `start` (over its producer's
// inputs and its users' outputs, transitively), each producing op call counted once (regenerating
// one output regenerates the others), at most kNeighbourhoodLimit of them. Walked with an
// explicit stack. A Graph gives:
//   void for_each_neighbour(Node n, F f)  f(m) for each input of n's producer and output of its users
//   bool evicted(Node n)                  dropped and regenerable
//   bool mark_producer(Node n)            true the first time n's producer is marked in this walk
//   double cost(Node n)                   regeneration_cost of n's producer
// mark_producer(start) is called first, so that start's own producer is never counted.
template <typename Graph, typename Node>
double evicted_neighbourhood_cost(Graph& graph, Node start) {
  graph.mark_producer(start);
  int counted = 1;
  double cost = 0;
  std::vector<Node> stack;
  auto visit = [&](Node n) {
    if (!graph.evicted(n) || counted > kNeighbourhoodLimit) return;
    if (graph.mark_producer(n)) {
      ++counted;
      cost += graph.cost(n);
      stack.push_back(n);
    }
  };
  graph.for_each_neighbour(start, visit);
  while (!stack.empty()) {
    const Node n = stack.back();
    stack.pop_back();
    graph.for_each_neighbour(n, visit);
  }
  return cost;
}

// The DTR paper's ignore-small rule: candidates under 1% of the mean size of `pool` (every
// resident candidate, evictable or not) are passed over while a larger one can go.
template <typename Pool, typename Bytes>
double small_candidate_bytes(const Pool& pool, Bytes&& bytes_of) {
  if (pool.empty()) return 0;
  double total = 0;
  for (const auto& c : pool) total += static_cast<double>(bytes_of(c));
  return 0.01 * total / static_cast<double>(pool.size());
}

// The index in `pool` of the candidate with the lowest score among those `usable` accepts (ties:
// the first in the pool's order); -1 if none.
template <typename Pool, typename Usable, typename Score>
int64_t lowest_score(const Pool& pool, Usable&& usable, Score&& score) {
  int64_t best = -1;
  double best_score = 0;
  for (size_t i = 0; i < pool.size(); ++i) {
    if (!usable(pool[i])) continue;
    const double s = score(pool[i]);
    if (best < 0 || s < best_score) {
      best = static_cast<int64_t>(i);
      best_score = s;
    }
  }
  return best;
}

// The victim: the lowest score among evictable candidates of at least the ignore-small size (when
// `ignore_small`), else among all evictable ones; -1 if none can go.
template <typename Pool, typename Bytes, typename Evictable, typename Score>
int64_t choose_victim(const Pool& pool, bool ignore_small, Bytes&& bytes_of, Evictable&& evictable, Score&& score) {
  const double min_bytes = ignore_small ? small_candidate_bytes(pool, bytes_of) : 0;
  const int64_t v = lowest_score(
      pool, [&](const auto& c) { return static_cast<double>(bytes_of(c)) >= min_bytes && evictable(c); }, score);
  return v >= 0 ? v : lowest_score(pool, evictable, score);
}

// Coop's sliding window (Zhang et al., "Coop: Memory is not a Commodity", NeurIPS 2023): when
// no free block is large enough, evicting the policy's favourites one by one frees memory all
// over the arena, most of which the waiting request cannot use. A window is a run of adjacent
// blocks in address order, free ones and evictable ones, that together span the request; its
// cost is what evicting everything in it costs (each tensor's score times its bytes: for dtr,
// (c + e*) / staleness). The cheapest window is evicted whole, and the request lands there.
struct ArenaBlock {
  int64_t bytes = 0;
  bool evictable = false;  // a free block, or a tensor that may go; otherwise the window breaks here
  double cost = 0;         // what evicting it costs (0 for a free block); never negative
};

// The cheapest run [first, last) of evictable blocks (in address order, adjacent) spanning at
// least `need` bytes; ties go to the lowest address. {-1, -1} if none. O(n): for each last block
// the shortest run ending there is the cheapest (costs are never negative).
inline std::pair<int64_t, int64_t> cheapest_window(const std::vector<ArenaBlock>& blocks, int64_t need) {
  std::pair<int64_t, int64_t> best{-1, -1};
  double best_cost = 0;
  int64_t first = 0, span = 0;
  double cost = 0;
  for (int64_t last = 0; last < static_cast<int64_t>(blocks.size()); ++last) {
    const ArenaBlock& b = blocks[static_cast<size_t>(last)];
    if (!b.evictable) {
      first = last + 1, span = 0, cost = 0;
      continue;
    }
    span += b.bytes, cost += b.cost;
    while (first < last && span - blocks[static_cast<size_t>(first)].bytes >= need) {
      span -= blocks[static_cast<size_t>(first)].bytes;
      cost -= blocks[static_cast<size_t>(first)].cost;
      ++first;
    }
    if (span >= need && (best.first < 0 || cost < best_cost)) {
      best = {first, last + 1};
      best_cost = cost;
    }
  }
  return best;
}

// What a window pays for evicting a candidate of `score` and `bytes`: the score is a cost per byte,
// so times the bytes it is the candidate's cost. Only the heuristics that weigh costs choose by
// windows (lru and largest are baselines: their scores are no costs).
inline double window_cost(double score, int64_t bytes) {
  return std::max(0.0, score) * static_cast<double>(std::max<int64_t>(bytes, 1));
}

}  // namespace ht

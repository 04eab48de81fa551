#include "memory/eviction_policy.h"

#include "alloc/cpu_arena.h"
#include "runtime/tensor_info.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_set>

namespace ht {
namespace {

// A kernel timed at 0 (a view, a tiny op) still costs something to regenerate; without a floor
// every such tensor would score 0 and be evicted first however often it comes back.
constexpr double kMinCostMs = 1e-6;
// megengine: a tensor evicted and regenerated k times scores kRecomputePenalty^k higher.
constexpr double kRecomputePenalty = 1.25;

double regeneration_cost(const TensorInfo& t, KernelCosts costs) {
  return std::max(costs == KernelCosts::kModeled ? t.modeled_ms() : t.compute_ms(), kMinCostMs);
}
double staleness(const TensorInfo& t, uint64_t now) {
  return static_cast<double>(now > t.last_access ? now - t.last_access : 0) + 1.0;
}
double bytes_of(const TensorInfo& t) { return static_cast<double>(std::max<int64_t>(t.nbytes, 1)); }

// Dropped and regenerable: what a recomputation of a neighbour would have to redo.
bool is_evicted(const TensorInfo* t) {
  return t != nullptr && !t->resident() && !t->is_leaf && t->producer != nullptr;
}

// Calls fn(n) for each neighbour of t: the inputs of its producer and the outputs of its users.
template <typename Fn>
void for_each_neighbour(const TensorInfo& t, Fn&& fn) {
  if (t.producer) {
    for (const auto& in : t.producer->inputs) fn(in.get());
  }
  for (const ComputePath* user : t.users) {
    for (TensorInfo* out : user->outputs) fn(out);
  }
}

double local_evicted_cost(const TensorInfo& t, KernelCosts costs) {
  std::unordered_set<const ComputePath*> counted{t.producer.get()};
  double cost = 0;
  for_each_neighbour(t, [&](const TensorInfo* n) {
    if (is_evicted(n) && counted.insert(n->producer.get()).second) cost += regeneration_cost(*n, costs);
  });
  return cost;
}

// The policies that weigh recomputation, by the job's kernel costs.
class CostWeighingPolicy : public EvictionPolicy {
 public:
  explicit CostWeighingPolicy(KernelCosts costs) : costs_(costs) {}

 protected:
  double cost_of(const TensorInfo& t) const { return regeneration_cost(t, costs_); }
  const KernelCosts costs_;
};

class DtrPolicy final : public CostWeighingPolicy {
 public:
  using CostWeighingPolicy::CostWeighingPolicy;
  double score(const TensorInfo& t, uint64_t now) const override {
    return (cost_of(t) + evicted_neighbourhood_cost(t, costs_)) / (bytes_of(t) * staleness(t, now));
  }
};

// Union-find over evicted tensors: a class's cost is the sum of its members' costs. As in the
// paper, a regenerated tensor leaves its class (its cost is subtracted) without splitting it.
class DtrEqPolicy final : public CostWeighingPolicy {
 public:
  using CostWeighingPolicy::CostWeighingPolicy;
  double score(const TensorInfo& t, uint64_t now) const override {
    double cost = cost_of(t);
    std::vector<int> roots;
    for_each_neighbour(t, [&](const TensorInfo* n) {
      auto it = n != nullptr ? index_.find(n) : index_.end();
      if (it == index_.end()) return;
      const int root = find(it->second);
      if (std::find(roots.begin(), roots.end(), root) == roots.end()) roots.push_back(root);
    });
    for (int r : roots) cost += nodes_[r].cost;
    return cost / (bytes_of(t) * staleness(t, now));
  }
  void on_dropped(const TensorInfo& t) override {
    if (!is_evicted(&t) || index_.count(&t) != 0) return;
    const int self = static_cast<int>(nodes_.size());
    nodes_.push_back({self, cost_of(t)});
    index_.emplace(&t, self);
    for_each_neighbour(t, [&](const TensorInfo* n) {
      auto it = n != nullptr ? index_.find(n) : index_.end();
      if (it != index_.end()) unite(self, it->second);
    });
  }
  void on_resident(const TensorInfo& t) override { leave(t); }
  void on_destroyed(const TensorInfo& t) override { leave(t); }

 private:
  struct Node {
    int parent;
    double cost;
  };
  int find(int i) const {
    while (nodes_[i].parent != i) {
      nodes_[i].parent = nodes_[nodes_[i].parent].parent;  // path halving
      i = nodes_[i].parent;
    }
    return i;
  }
  void unite(int a, int b) {
    a = find(a);
    b = find(b);
    if (a == b) return;
    nodes_[b].parent = a;
    nodes_[a].cost += nodes_[b].cost;
  }
  void leave(const TensorInfo& t) {
    auto it = index_.find(&t);
    if (it == index_.end()) return;
    Node& root = nodes_[find(it->second)];
    root.cost = std::max(0.0, root.cost - cost_of(t));
    index_.erase(it);
    if (index_.empty()) nodes_.clear();  // between steps nothing is evicted: start afresh
  }

  mutable std::vector<Node> nodes_;  // find() compresses paths
  std::unordered_map<const TensorInfo*, int> index_;
};

class MegEnginePolicy final : public CostWeighingPolicy {
 public:
  MegEnginePolicy(const CpuArena* arena, KernelCosts costs) : CostWeighingPolicy(costs), arena_(arena) {}
  double score(const TensorInfo& t, uint64_t now) const override {
    double free_neighbours = 0;
    if (arena_ != nullptr && t.value.defined() && t.value.has_storage()) {
      const void* data = t.value.storage().data();
      if (arena_->contains(data)) free_neighbours = static_cast<double>(arena_->adjacent_free_bytes(data));
    }
    const double cost = (cost_of(t) + local_evicted_cost(t, costs_)) * std::pow(kRecomputePenalty, t.recompute_count);
    return cost / ((bytes_of(t) + free_neighbours) * staleness(t, now));
  }

 private:
  const CpuArena* arena_;
};

class LruPolicy final : public EvictionPolicy {
 public:
  double score(const TensorInfo& t, uint64_t now) const override { return -staleness(t, now); }
};

class LargestPolicy final : public EvictionPolicy {
 public:
  double score(const TensorInfo& t, uint64_t /*now*/) const override { return -bytes_of(t); }
};

}  // namespace

std::optional<EvictionHeuristic> eviction_heuristic_from_name(const std::string& name) {
  for (EvictionHeuristic h : {EvictionHeuristic::kDtr, EvictionHeuristic::kDtrEq, EvictionHeuristic::kMegEngine,
                              EvictionHeuristic::kLru, EvictionHeuristic::kLargest}) {
    if (name == eviction_heuristic_name(h)) return h;
  }
  return std::nullopt;
}

const char* eviction_heuristic_name(EvictionHeuristic heuristic) {
  switch (heuristic) {
    case EvictionHeuristic::kDtr: return "dtr";
    case EvictionHeuristic::kDtrEq: return "dtr_eq";
    case EvictionHeuristic::kMegEngine: return "megengine";
    case EvictionHeuristic::kLru: return "lru";
    case EvictionHeuristic::kLargest: return "largest";
  }
  return "?";
}

std::optional<KernelCosts> kernel_costs_from_name(const std::string& name) {
  for (KernelCosts c : {KernelCosts::kModeled, KernelCosts::kMeasured}) {
    if (name == kernel_costs_name(c)) return c;
  }
  return std::nullopt;
}

const char* kernel_costs_name(KernelCosts costs) {
  return costs == KernelCosts::kModeled ? "modeled" : "measured";
}

double evicted_neighbourhood_cost(const TensorInfo& t, KernelCosts costs, int limit) {
  // The evicted component around t, walked with an explicit stack; an op call's cost counts once
  // (regenerating one output of it regenerates the others).
  std::unordered_set<const ComputePath*> counted{t.producer.get()};
  std::vector<const TensorInfo*> stack;
  double cost = 0;
  auto visit = [&](const TensorInfo* n) {
    if (!is_evicted(n) || static_cast<int>(counted.size()) > limit) return;
    if (counted.insert(n->producer.get()).second) {
      cost += regeneration_cost(*n, costs);
      stack.push_back(n);
    }
  };
  for_each_neighbour(t, visit);
  while (!stack.empty()) {
    const TensorInfo* n = stack.back();
    stack.pop_back();
    for_each_neighbour(*n, visit);
  }
  return cost;
}

std::unique_ptr<EvictionPolicy> make_eviction_policy(EvictionHeuristic heuristic, const CpuArena* arena,
                                                     KernelCosts costs) {
  switch (heuristic) {
    case EvictionHeuristic::kDtr: return std::make_unique<DtrPolicy>(costs);
    case EvictionHeuristic::kDtrEq: return std::make_unique<DtrEqPolicy>(costs);
    case EvictionHeuristic::kMegEngine: return std::make_unique<MegEnginePolicy>(arena, costs);
    case EvictionHeuristic::kLru: return std::make_unique<LruPolicy>();
    case EvictionHeuristic::kLargest: return std::make_unique<LargestPolicy>();
  }
  return nullptr;
}

Evictor::Evictor(EvictionOptions options, const CpuArena* arena)
    : options_(options), policy_(make_eviction_policy(options.heuristic, arena, options.costs)), rng_(options.seed) {}

TensorInfo* Evictor::best_of(const std::vector<TensorInfo*>& pool, uint64_t now, double min_bytes) const {
  TensorInfo* best = nullptr;
  double best_score = std::numeric_limits<double>::infinity();
  for (TensorInfo* t : pool) {
    if (static_cast<double>(t->nbytes) < min_bytes || !t->evictable()) continue;
    const double s = policy_->score(*t, now);
    if (best == nullptr || s < best_score) {
      best = t;
      best_score = s;
    }
  }
  return best;
}

TensorInfo* Evictor::pick_victim(const std::vector<TensorInfo*>& candidates, uint64_t now) {
  if (candidates.empty()) return nullptr;
  std::vector<TensorInfo*> sample;
  const std::vector<TensorInfo*>* pool = &candidates;
  if (options_.sqrt_sampling && candidates.size() > 4) {
    const size_t k = static_cast<size_t>(std::ceil(std::sqrt(static_cast<double>(candidates.size()))));
    std::uniform_int_distribution<size_t> pick(0, candidates.size() - 1);
    sample.reserve(k);
    for (size_t i = 0; i < k; ++i) sample.push_back(candidates[pick(rng_)]);
    pool = &sample;
  }
  double min_bytes = 0;
  if (options_.ignore_small) {
    double total = 0;
    for (const TensorInfo* t : *pool) total += static_cast<double>(t->nbytes);
    min_bytes = 0.01 * total / static_cast<double>(pool->size());
  }
  if (TensorInfo* v = best_of(*pool, now, min_bytes)) return v;
  if (TensorInfo* v = best_of(*pool, now, 0)) return v;
  // The sample held nothing evictable (all pinned, say): look at everything before giving up.
  return pool == &candidates ? nullptr : best_of(candidates, now, 0);
}

}  // namespace ht

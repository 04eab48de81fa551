#include "memory/eviction_policy.h"

#include "alloc/cpu_arena.h"
#include "runtime/tensor_info.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

namespace ht {
namespace {

double cost_of(const TensorInfo& t, KernelCosts costs) {
  return regeneration_cost(costs == KernelCosts::kModeled ? t.modeled_ms() : t.compute_ms());
}

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

// The records' graph as eviction_score.h walks it.
class RecordGraph {
 public:
  explicit RecordGraph(KernelCosts costs) : costs_(costs) {}
  template <typename Fn>
  void for_each_neighbour(const TensorInfo* t, Fn&& fn) const { ht::for_each_neighbour(*t, fn); }
  bool evicted(const TensorInfo* t) const { return is_evicted(t); }
  bool mark_producer(const TensorInfo* t) { return counted_.insert(t->producer.get()).second; }
  double cost(const TensorInfo* t) const { return cost_of(*t, costs_); }

 private:
  KernelCosts costs_;
  std::unordered_set<const ComputePath*> counted_;
};

double local_evicted_cost(const TensorInfo& t, KernelCosts costs) {
  std::unordered_set<const ComputePath*> counted{t.producer.get()};
  double cost = 0;
  for_each_neighbour(t, [&](const TensorInfo* n) {
    if (is_evicted(n) && counted.insert(n->producer.get()).second) cost += cost_of(*n, costs);
  });
  return cost;
}

EvictionCandidate plain_candidate(const TensorInfo& t, KernelCosts costs) {
  EvictionCandidate c;
  c.cost_ms = cost_of(t, costs);
  c.bytes = CpuArena::rounded_size(static_cast<size_t>(t.nbytes));  // what evicting it frees
  c.last_access = t.last_access;
  c.recompute_count = t.recompute_count;
  return c;
}

// The policies that weigh recomputation, by the job's kernel costs.
class CostWeighingPolicy : public EvictionPolicy {
 public:
  explicit CostWeighingPolicy(KernelCosts costs) : costs_(costs) {}

 protected:
  double cost_of(const TensorInfo& t) const { return ht::cost_of(t, costs_); }
  const KernelCosts costs_;
};

class DtrPolicy final : public CostWeighingPolicy {
 public:
  using CostWeighingPolicy::CostWeighingPolicy;
  double score(const TensorInfo& t, uint64_t now) const override {
    return eviction_score(EvictionHeuristic::kDtr, candidate_of(t, costs_), now);
  }
};

// Union-find over evicted tensors: a class's cost is the sum of its members' costs. As in the
// paper, a regenerated tensor leaves its class (its cost is subtracted) without splitting it.
class DtrEqPolicy final : public CostWeighingPolicy {
 public:
  using CostWeighingPolicy::CostWeighingPolicy;
  double score(const TensorInfo& t, uint64_t now) const override {
    EvictionCandidate c = plain_candidate(t, costs_);
    std::vector<int> roots;
    for_each_neighbour(t, [&](const TensorInfo* n) {
      auto it = n != nullptr ? index_.find(n) : index_.end();
      if (it == index_.end()) return;
      const int root = find(it->second);
      if (std::find(roots.begin(), roots.end(), root) == roots.end()) roots.push_back(root);
    });
    for (int r : roots) c.neighbourhood_ms += nodes_[r].cost;
    return eviction_score(EvictionHeuristic::kDtrEq, c, now);
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
    EvictionCandidate c = plain_candidate(t, costs_);
    c.neighbourhood_ms = local_evicted_cost(t, costs_);
    if (arena_ != nullptr && t.value.defined() && t.value.has_storage()) {
      const void* data = t.value.storage().data();
      if (arena_->contains(data)) c.free_neighbour_bytes = arena_->adjacent_free_bytes(data);
    }
    return eviction_score(EvictionHeuristic::kMegEngine, c, now);
  }

 private:
  const CpuArena* arena_;
};

class LruPolicy final : public EvictionPolicy {
 public:
  double score(const TensorInfo& t, uint64_t now) const override {
    return eviction_score(EvictionHeuristic::kLru, plain_candidate(t, KernelCosts::kModeled), now);
  }
};

class LargestPolicy final : public EvictionPolicy {
 public:
  double score(const TensorInfo& t, uint64_t now) const override {
    return eviction_score(EvictionHeuristic::kLargest, plain_candidate(t, KernelCosts::kModeled), now);
  }
};

}  // namespace

double evicted_neighbourhood_cost(const TensorInfo& t, KernelCosts costs) {
  RecordGraph graph(costs);
  return ht::evicted_neighbourhood_cost(graph, &t);
}

EvictionCandidate candidate_of(const TensorInfo& t, KernelCosts costs) {
  EvictionCandidate c = plain_candidate(t, costs);
  c.neighbourhood_ms = evicted_neighbourhood_cost(t, costs);
  return c;
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
  auto bytes_of = [](const TensorInfo* t) { return CpuArena::rounded_size(static_cast<size_t>(t->nbytes)); };
  auto evictable = [](const TensorInfo* t) { return t->evictable(); };
  auto score = [&](const TensorInfo* t) { return policy_->score(*t, now); };
  int64_t v = choose_victim(*pool, options_.ignore_small, bytes_of, evictable, score);
  if (v >= 0) return (*pool)[static_cast<size_t>(v)];
  // The sample held nothing evictable (all pinned, say): look at everything before giving up.
  if (pool == &candidates) return nullptr;
  v = lowest_score(candidates, evictable, score);
  return v >= 0 ? candidates[static_cast<size_t>(v)] : nullptr;
}

}  // namespace ht

#pragma once
// Eviction policies: which resident tensor to drop when memory is short. A policy only scores
// candidates (lower score: evict first) and may keep its own view of the evicted graph; the
// memory manager evicts, regenerates and accounts (memory_manager.h). The scores, the rules of
// the victim's choice and e* are defined once in eviction_score.h, shared with the planner's
// replay; this file applies them to tensor records. Policies, after the DTR paper (Kirisame et
// al. 2021) and MegEngine's engineering of it:
//   dtr        h = (c + e*) / (m * s): compute cost c plus the cost of the evicted neighbourhood
//              e* (evicted tensors that evicting this one would make dearer to regenerate),
//              over bytes m times staleness s;
//   dtr_eq     the same with e* approximated by union-find equivalence classes of evicted tensors;
//   megengine  one-hop evicted neighbours, free bytes adjacent to the tensor's block added to m
//              (evicting next to free memory grows a contiguous block), and a factor per earlier
//              recomputation (a tensor that keeps coming back is expensive to evict);
//   lru        least recently used first;  largest  largest first (baselines).

#include "base/choice.h"
#include "memory/eviction_score.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

namespace ht {

struct TensorInfo;
class CpuArena;

// What a policy takes for the cost of recomputing a tensor's producer (memory.kernel_costs).
enum class KernelCosts : uint8_t {
  kModeled,   // runtime/kernel_cost.h: deterministic, so a budget that trains once trains every time
  kMeasured,  // the kernel's measured time: closer to the truth, and as noisy as the machine
};
template <>
struct ChoiceNames<KernelCosts> {
  static constexpr std::pair<KernelCosts, const char*> table[] = {{KernelCosts::kModeled, "modeled"},
                                                                  {KernelCosts::kMeasured, "measured"}};
};

struct EvictionOptions {
  EvictionHeuristic heuristic = EvictionHeuristic::kDtr;
  // Score ceil(sqrt(N)) random candidates, not all N (DTR paper). Off by default: with the few
  // hundred candidates of a training step scoring all is cheap, and sampling chose worse (ResNet-18
  // at 0.8: 8.8% of the step recomputing with sampling, 2.8% without; bench_dtr_budget).
  bool sqrt_sampling = false;
  bool ignore_small = true;   // skip candidates under 1% of the mean candidate size (DTR paper)
  uint64_t seed = 0;          // of the sampling; eviction choices never change results
  KernelCosts costs = KernelCosts::kModeled;
  // When a request finds no free block large enough, evict the cheapest window of adjacent
  // blocks that makes one (Coop; eviction_score.h: cheapest_window) rather than the policy's
  // favourites one by one wherever they lie. Heuristics that weigh costs only (not lru, largest).
  bool window = true;
};

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  // Lower is evicted first. `t` is a resident root; `now` the interpreter's tick.
  virtual double score(const TensorInfo& t, uint64_t now) const = 0;
  // The evicted graph changed (every non-leaf tensor, views included, is reported).
  virtual void on_dropped(const TensorInfo& t) {}
  virtual void on_resident(const TensorInfo& t) {}
  virtual void on_destroyed(const TensorInfo& t) {}
};

// `arena` (may be null) lets megengine see free neighbours of a tensor's block.
std::unique_ptr<EvictionPolicy> make_eviction_policy(EvictionHeuristic heuristic, const CpuArena* arena,
                                                     KernelCosts costs = KernelCosts::kModeled);

// Chooses victims among candidates with the paper's approximations, then the policy's score.
class Evictor {
 public:
  Evictor(EvictionOptions options, const CpuArena* arena);
  // The evictable candidate (TensorInfo::evictable) with the lowest score; nullptr if none.
  TensorInfo* pick_victim(const std::vector<TensorInfo*>& candidates, uint64_t now);
  EvictionPolicy& policy() { return *policy_; }
  const EvictionOptions& options() const { return options_; }

 private:
  EvictionOptions options_;
  std::unique_ptr<EvictionPolicy> policy_;
  std::mt19937_64 rng_;
};

// The compute cost (ms) of the evicted neighbourhood of `t` that the dtr policy adds to t's own
// cost (eviction_score.h: evicted_neighbourhood_cost, over tensor records).
double evicted_neighbourhood_cost(const TensorInfo& t, KernelCosts costs = KernelCosts::kModeled);
// What `heuristic` knows of `t` (neighbourhood_ms: e*, as dtr weighs it).
EvictionCandidate candidate_of(const TensorInfo& t, KernelCosts costs);

}  // namespace ht

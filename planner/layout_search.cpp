#include "planner/layout_search.h"

#include "planner/cost_model.h"
#include "planner/recompute_terms.h"

#include <algorithm>
#include <functional>
#include <utility>

namespace ht {
namespace {

// An eviction plan that evicts nothing is its plan without eviction, listed twice: keep the one
// without, unless it alone does not fit.
void drop_idle_eviction(std::vector<RankedPlan>& ranked) {
  auto twin_fits = [&](const Plan& p) {
    for (const RankedPlan& r : ranked) {
      const Plan& q = r.plan;
      if (!evicts(q.policy) && q.ranks == p.ranks && q.split() == p.split() && q.stages == p.stages &&
          q.schedule == p.schedule && q.shard == p.shard && q.micro_batch == p.micro_batch && q.precision == p.precision)
        return r.prediction.fits;
    }
    return false;
  };
  std::vector<char> drop;
  for (const RankedPlan& r : ranked) {
    drop.push_back(evicts(r.plan.policy) && r.prediction.evictions == 0 && twin_fits(r.plan));
  }
  std::vector<RankedPlan> kept;
  for (size_t i = 0; i < ranked.size(); ++i) {
    if (!drop[i]) kept.push_back(std::move(ranked[i]));
  }
  ranked = std::move(kept);
}

// A traced model's replay is long (Llama 3 8B: 80,000 tensors a micro-batch: the blockwise
// attention's temporaries), so plans with eviction are replayed only where eviction can be the
// answer: not where their twin without it fits (it would evict nothing), nor where the state
// alone leaves no room, nor where the room is under a fifth of a micro-batch's activations
// (beyond the budgets issue 34 measures, and slower than a smaller micro-batch).
std::vector<Plan> without_needless_eviction(const std::vector<Plan>& plans,
                                            const std::function<Prediction(const Plan&)>& predict_plan) {
  std::vector<Plan> kept;
  for (const Plan& p : plans) {
    if (evicts(p.policy)) {
      Plan twin = p;
      twin.policy = MemoryPolicy::kNone;
      twin.budget_bytes = 0;  // as the search has it (a GPU plan without eviction has no arena)
      const Prediction t = predict_plan(twin);
      const int64_t fixed = t.peak_bytes - std::max(t.activation_bytes, t.optimizer_working_bytes);
      const int64_t room = p.budget_bytes - fixed;
      if (t.fits) continue;
      // DTR needs room for a share of the activations; recomputing blocks (full, per_block) needs a
      // block's, and was in the search before DTR joined it: kept.
      if (!recomputes_blocks(p.policy) && (room <= 0 || room < t.activation_bytes / 5)) continue;
    }
    kept.push_back(p);
  }
  return kept;
}

// Per-block plans only where their layout does not fit without recomputation: where it does, every
// share of the ladder only adds regenerations to the plan without one, and each share's replays
// cost as much as full recomputation's (Llama 3 8B on 8 devices).
std::vector<Plan> without_needless_block_plans(std::vector<Plan> plans,
                                               const std::function<Prediction(const Plan&)>& predict_plan) {
  plans.erase(std::remove_if(plans.begin(), plans.end(),
                             [&](const Plan& p) {
                               if (p.policy != MemoryPolicy::kPerBlock) return false;
                               Plan twin = p;
                               twin.policy = MemoryPolicy::kNone;
                               twin.budget_bytes = 0;
                               twin.block_keep_share = 0;
                               return predict_plan(twin).fits;
                             }),
              plans.end());
  return plans;
}

// The full-recomputation plans' block replays, each distinct one once, on every core, before the
// plans are predicted (planner/recompute_terms.h).
void replay_ahead(const std::vector<Plan>& plans, const SplitProfiles& profiles,
                  const Machine& machine, int threads) {
  std::vector<std::pair<const ModelProfile*, Plan>> replayed;
  for (const Plan& p : plans)
    if (replays_blocks(machine, p)) replayed.emplace_back(&profiles.at(p.split()), p);
  replay_blocks_ahead(replayed, threads);
}

}  // namespace

std::vector<RankedPlan> rank_layouts(const SplitProfiles& profiles, const Machine& machine,
                                     LayoutSearch search) {
  auto with_arenas = [&](std::vector<Plan> plans) {
    if (search.device_arenas) {
      for (Plan& p : plans) {
        p.budget_bytes = evicts(p.policy) ? std::max<int64_t>(0, p.budget_bytes - machine.reserved_bytes(
                                                                     p.weight_replicas() > 1, p.tensor > 1, p.stages > 1, p.context > 1))
                                          : 0;
      }
    }
    return plans;
  };
  auto predict_plan = [&](const Plan& p) { return predict(profiles.at(p.split()), machine, p); };
  const Objective objective = search.options.objective;
  std::vector<Plan> plans = without_needless_block_plans(
      with_arenas(candidate_plans(search.global_batch, machine.device_memory, search.options)), predict_plan);
  replay_ahead(plans, profiles, machine, search.threads);
  std::vector<RankedPlan> ranked = rank_plans(plans, predict_plan, objective, search.threads);
  if (search.evict_if_needed && (ranked.empty() || !ranked[0].prediction.fits)) {
    search.options.policies = {MemoryPolicy::kNone, MemoryPolicy::kFull, MemoryPolicy::kPerBlock, MemoryPolicy::kDtr};
    plans = without_needless_eviction(
        with_arenas(candidate_plans(search.global_batch, machine.device_memory, search.options)), predict_plan);
    replay_ahead(plans, profiles, machine, search.threads);
    ranked = rank_plans(plans, predict_plan, objective, search.threads);
  }
  drop_idle_eviction(ranked);
  return ranked;
}

std::vector<int64_t> traced_sizes(int64_t largest) {
  std::vector<int64_t> sizes{1};
  while (sizes.back() * 2 <= largest) sizes.push_back(sizes.back() * 2);
  if (sizes.back() != largest) sizes.push_back(largest);
  return sizes;
}

int64_t replica_batch(int64_t global_batch, int ranks, int split) {
  const int replicas = std::max(1, ranks / std::max(1, split));
  return std::max<int64_t>(1, global_batch / replicas);
}

}  // namespace ht

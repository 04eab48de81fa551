#pragma once
// The planner's entry for a job: every layout a search allows over the profiles of each split of
// a replica's ranks (a profile is one rank's part of the model), predicted on the machine and
// ranked best first. The launcher only turns a config into these inputs
// (launcher/planning/job_plan.h: which profiles, which machine, which options).

#include "planner/machine.h"
#include "planner/plan.h"
#include "planner/profile.h"
#include "planner/search.h"

#include <cstdint>
#include <map>
#include <vector>

namespace ht {

// One rank's profile for each split of a replica's ranks (tensor-parallel size, context size).
using SplitProfiles = std::map<RankSplit, ModelProfile>;

struct LayoutSearch {
  SearchOptions options;     // options.splits: the splits of `profiles` planned
  int64_t global_batch = 0;  // samples per step, over every replica
  // A catalog device's plans (GPUs): a plan without eviction has no budget (on a GPU a budget is
  // an arena, alloc/cuda_arena.h) and an evicting plan's arena is the device less what the runtime
  // holds beside it (Machine::reserved_bytes).
  bool device_arenas = false;
  // Where nothing fits: plans with DTR and full recomputation added, replayed only where eviction
  // can be the answer (not where their twin without it fits, nor where the state leaves no room).
  bool evict_if_needed = false;
  int threads = 1;  // the cores the predictions and replays share
};

// The plans of `search`, each predicted by the profile of its split, ranked by
// search.options.objective; a plan with eviction that evicts nothing is dropped beside its twin
// without eviction, unless it alone fits.
std::vector<RankedPlan> rank_layouts(const SplitProfiles& profiles, const Machine& machine,
                                     LayoutSearch search);

// The micro-batch sizes a traced profile prices: powers of two up to `largest`, and `largest`
// (memory is exact between any two; time is interpolated between neighbours).
std::vector<int64_t> traced_sizes(int64_t largest);
// The most samples a replica of `split` ranks (tensor x context) trains per step when the job has `ranks`.
int64_t replica_batch(int64_t global_batch, int ranks, int split);

}  // namespace ht

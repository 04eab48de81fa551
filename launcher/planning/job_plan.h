#pragma once
// The planner as the launcher uses it: the machine a job plans for (this one, measured, or the
// config's [cluster]), the profile of its model, the ranked plans, and a plan as a config that
// trains as is. `hybrid_train plan` prints it (plan_command.h); run_job() predicts its own plan
// before the first step, refuses one that cannot fit, and with parallel.strategy = "auto" trains
// the planner's choice.

#include "launcher/config/config.h"
#include "launcher/data/dataset.h"
#include "planner/search.h"

#include <map>
#include <string>
#include <vector>

namespace ht {

// What is planned for; empty fields take the defaults (docs/planner.md, "Options").
struct PlanArgs {
  std::vector<int> ranks;                // rank counts; empty: 1, 2, 4, ... up to the machine's
  std::vector<int> stages{1, 2, 4};      // pipeline stages (each dividing a rank count, at most the blocks)
  int64_t device_memory = 0;             // bytes per rank; 0: the config's budget, else the machine's
  Objective objective = Objective::kTime;
  int max_ranks = 0;                     // 0: no cap
  std::vector<MixedPrecision> precisions;  // empty: the config's and bf16
  std::vector<MemoryPolicy> policies{MemoryPolicy::kNone, MemoryPolicy::kDtr, MemoryPolicy::kStatic};
  // Sharding levels (parallel.shard) for plans of several replicas; the built ones by default.
  std::vector<ShardLevel> shards{ShardLevel::kNone, ShardLevel::kOptimizer, ShardLevel::kGradients,
                                 ShardLevel::kParameters};
  // Tensor-parallel group sizes (each profiled apart: a profile is one rank's part of the model);
  // empty: the config's parallel.tensor_parallel. Sizes the model cannot split are skipped.
  std::vector<int> tensor;
};

struct JobPlan {
  ModelProfile profile;  // of the first tensor-parallel size planned (a rank's part of the model)
  std::map<int, ModelProfile> tensor_profiles;  // by tensor-parallel size, the first's included
  Machine machine;
  std::vector<RankedPlan> ranked;  // best first; ranked[0].prediction.fits when anything fits
  std::string why;                 // why ranked[0] wins
};

// This machine (ranks sharing its cores, links measured with a copy micro-benchmark) or the
// config's [cluster]; `max_ranks`: the most ranks planned for.
Machine machine_for(const Config& config, const PlanArgs& args, int max_ranks);
// Profiles the model (launcher/planning/profiler.h) and searches.
JobPlan plan_job(const Config& config, const Dataset& train, const DataInfo& info, const PlanArgs& args);
// `base` changed to train `plan`: ranks, micro-batch size, precision, memory policy and budget.
Config config_for_plan(const Config& base, const Plan& plan);
// The plan in words: "2 ranks, micro-batch 32 x 2, bf16, dtr at 256.0 MiB".
std::string plan_words(const Plan& plan);

}  // namespace ht

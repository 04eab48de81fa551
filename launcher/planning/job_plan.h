#pragma once
// The planner as the launcher uses it: a config turned into the planner's inputs (the machine a
// job plans for: this one, measured, or the config's [cluster]; the profile of its model at each
// tensor-parallel size; the search's options), the planner's ranking (planner/layout_search.h),
// and a plan as a config that trains as is. `hybrid_train plan` prints it (plan_command.h); run_job() predicts its own plan
// before the first step, refuses one that cannot fit, and with parallel.strategy = "auto" trains
// the planner's choice.

#include "launcher/config/config.h"
#include "launcher/data/dataset.h"
#include "planner/cost_model.h"
#include "planner/layout_search.h"
#include "planner/search.h"
#include "training/run_plan.h"

#include <map>
#include <string>
#include <vector>

namespace ht {

// Tokens a sequence from which a cluster's search also splits it across context groups (PlanArgs::
// context): the lengths torchtitan's and Megatron's context-parallel runs start from (Llama 3
// 8B's published CP rows begin at 32K; at 8K, its pretraining length, attention's activations
// are a small part of a layer's). Below it each size would add a trace per tensor size for plans
// that only exchange more.
constexpr int64_t kLongSequence = 16384;

// What is planned for; empty fields take the defaults (docs/planner.md, "Options").
struct PlanArgs {
  std::vector<int> ranks;                // rank counts; empty: 1, 2, 4, ... up to the machine's
  // Pipeline stages (each dividing a rank count, at most the blocks); empty: 1, 2 and 4, and for
  // a catalog device ([cluster].device) powers of two up to 16.
  std::vector<int> stages;
  int64_t device_memory = 0;             // bytes per rank; 0: the config's budget, else the machine's
  Objective objective = Objective::kTime;
  int max_ranks = 0;                     // 0: no cap
  std::vector<MixedPrecision> precisions;  // empty: the config's and bf16
  std::vector<MemoryPolicy> policies{MemoryPolicy::kNone, MemoryPolicy::kDtr, MemoryPolicy::kStatic,
                                     MemoryPolicy::kFull, MemoryPolicy::kPerBlock};
  // Sharding levels (parallel.shard) for plans of several replicas; the built ones by default.
  std::vector<ShardLevel> shards{ShardLevel::kNone, ShardLevel::kOptimizer, ShardLevel::kGradients,
                                 ShardLevel::kParameters};
  // Tensor-parallel group sizes (each profiled apart: a profile is one rank's part of the model);
  // empty: the config's parallel.tensor_parallel, and for a catalog device powers of two up to a
  // node's devices (Megatron's advice: the group's collectives stay on NVLink). Sizes the model
  // cannot split are skipped.
  std::vector<int> tensor;
  // Context-parallel group sizes for a gpt or llama model (each profiled apart, with every tensor
  // size: a profile is one rank's chunks); empty: parallel.context_parallel, and where that is 1,
  // for a catalog device and a long sequence (kLongSequence tokens or more), powers of two up to a
  // node's devices without tensor groups (their exchanges stay on NVLink; torchtitan's long-context
  // recipe). Sizes the sequence cannot split are skipped.
  std::vector<int> context;
  // How each context size's attention exchanges keys and values (each a profile of its own: the
  // gathers hold the whole sequence's keys and values while a layer's attention runs, the ring two
  // chunks); empty: parallel.context_exchange alone. Both where asked: the gathers send the same
  // bytes in fewer, larger messages, so where both fit the search weighs their steps.
  std::vector<ContextExchange> context_exchanges;
  std::string devices_file;  // --devices: a catalog of the user's over the built-in one
  // The micro-batch sizes a profile of this machine trains (launcher/planning/profiler.h); empty:
  // every size a plan may use. A run that only checks its own plan trains its own size.
  std::vector<int64_t> trained_sizes;
  int64_t train_samples = 0;  // the training set's size, where [cluster].device plans without reading it
  // The job's ranks on this host, where a rank plans its own run (0: `hybrid_train plan`, one
  // process): the host's CPUs are theirs together, not this process's binding alone.
  int ranks_on_host = 0;
  // Profiles already made for this job, by split: used instead of profiling again (the search for
  // the smallest cluster that fits plans several clusters of one kind).
  const SplitProfiles* profiles = nullptr;
};

struct JobPlan {
  ModelProfile profile;  // of the first split planned (a rank's part of the model)
  SplitProfiles split_profiles;  // by tensor-parallel and context size and exchange, the first's included
  Machine machine;
  std::vector<RankedPlan> ranked;  // best first; ranked[0].prediction.fits when anything fits
  std::string why;                 // why ranked[0] wins
  std::string time_source;         // where the step times come from, for the report
};

// This machine (ranks sharing its cores, links measured with a copy micro-benchmark) or the
// config's [cluster]; `max_ranks`: the most ranks planned for.
Machine machine_for(const Config& config, const PlanArgs& args, int max_ranks);
// Profiles the model (launcher/planning/profiler.h), or with [cluster].device traces it on meta
// tensors priced at that kind's rates (launcher/planning/trace_profile.h; `train` may then be
// null), and searches.
JobPlan plan_job(const Config& config, const Dataset* train, const DataInfo& info, const PlanArgs& args);
// With [cluster].device and no plan fitting: the smallest cluster of that kind on which one fits
// (a node's devices in powers of two, then nodes of the kind's usual size, up to 128 nodes), as
// "KIND:NODESxDEVICES" with that plan in words; "" when none does. `plan` is the failed plan's.
std::string smallest_fitting_cluster(const Config& config, const DataInfo& info, const PlanArgs& args,
                                     const JobPlan& plan);
// The run `base` becomes when it trains the planner's `plan` (its grid, micro-batches, precision,
// memory policy and budget, shard level), for no rank in particular; and that run written out as
// config keys (config_as_run): what `plan` writes to plan.toml.
RunPlan planned_run(const Config& base, const Plan& plan);
Config config_for_plan(const Config& base, const Plan& plan);

}  // namespace ht

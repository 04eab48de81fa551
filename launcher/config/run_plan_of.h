#pragma once
// From what the user wrote to what this rank runs: the resolved plan (training/run_plan.h) of a
// validated config on one rank of the process grid, and back: the plan's decisions as the config
// keys that train them (config.resolved.toml, plan.toml). The config itself is never changed
// after load_config; the planner's automatic choices (launcher/planning/run_check.h) change the
// plan before the job freezes it.

#include "launcher/config/config.h"
#include "parallel/process_grid.h"
#include "training/run_plan.h"

#include <optional>
#include <string>
#include <vector>

namespace ht {

// The plan of `config` on this rank of `grid`: the grid's degrees and coordinates (with
// parallel.data_parallel checked against the ranks there are), the micro-batches, the budget's
// bytes, the device ("cuda" resolved to this rank's GPU under mpirun). UserError where the job's
// ranks do not fit the config (the global batch does not divide among the replicas, a pipeline
// schedule that cannot run so many micro-batches). `warnings`: options without effect on this
// grid (a shard level with one replica), for the first rank to say.
RunPlan run_plan_of(const Config& config, const ProcessGrid& grid, std::vector<std::string>* warnings = nullptr);
// The same on a grid of one rank (the planner's probes, tests).
RunPlan run_plan_of(const Config& config);
// The plan of `config` as the keys say it, on `replicas` data-parallel replicas and the keys'
// pipeline and tensor degrees, for no rank in particular (this rank's coordinates 0, the device
// as written): what the planner's choices are written over (launcher/planning/job_plan.h).
RunPlan plan_of_config(const Config& config, int replicas);

// `config` with the plan's decisions written back as keys (the device, the grid's degrees, the
// pipeline's schedule and cut, the shard level, the micro-batch size, the precision, the budget in
// bytes where it changed, the policy, its threshold, the optimizer state's place): a new Config
// that trains as the plan does. config.resolved.toml and plan.toml are it.
Config config_as_run(const Config& config, const RunPlan& plan);

// [training]'s optimizer keys.
OptimizerOptions optimizer_options_of(const TrainingConfig& training);

// The micro-batch the config trains with on the replicas it names (parallel.data_parallel; one
// where it says "all ranks"): what the planner plans for when it plans the config, not a run.
int64_t configured_micro_batch(const Config& config);

// memory.budget and memory.host_budget in bytes (0: none; the host's default share where
// host_budget is empty), as validation checked them.
int64_t budget_bytes_of(const Config& config);
int64_t host_budget_bytes_of(const Config& config);
// memory.block_keep under per_block: bytes, or a share of what each block's backward reads
// ({0, 0} elsewhere, or where it is left to the planner).
std::pair<int64_t, double> block_keep_of(const Config& config);
// memory.block_keep's entries, split at commas: one value for every block, or one share per
// pipeline stage ("25%,75%": AdaPipe's plan, the first stage holding the most micro-batches).
std::vector<std::string> block_keep_entries(const std::string& keep);
// An entry that keeps nothing on the device ("0%", "0").
bool keeps_none(const std::string& entry);
// One stage's entry, "0%" to "100%", as a share (0 to 1); nothing where it is not one.
std::optional<double> stage_share_of(const std::string& entry);
// Under per_block, the shares per pipeline stage where memory.block_keep names one a stage;
// empty where it names one value for every stage (or none).
std::vector<double> stage_block_keep_of(const Config& config);

}  // namespace ht

#include "launcher/planning/run_check.h"

#include "launcher/planning/job_plan.h"
#include "launcher/planning/fit_refusal.h"
#include "launcher/planning/planned_here.h"
#include "launcher/planning/profiler.h"
#include "base/user_error.h"
#include "alloc/byte_size.h"
#include "alloc/cuda_arena.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>

namespace ht {
namespace {

// The planner's Plan of the run: its grid, batch, budget and policy. (The shard level is the
// config's: with one replica the run holds everything whatever it says, and so does the plan.)
Plan plan_of(const Config& c, const RunPlan& run) {
  Plan p;
  p.ranks = run.grid.data;
  p.micro_batch = run.batch.micro;
  p.accumulation = run.batch.micro_batches;
  p.precision = run.precision;
  p.compute_weights = run.compute_weights;
  p.gradient_dtype = run.gradient_dtype;
  p.policy = run.memory.policy;
  p.block_keep_bytes = run.memory.block_keep_bytes;
  p.block_keep_share = run.memory.block_keep_share;
  p.stage_block_keep = run.memory.stage_block_keep;
  if (!p.stage_block_keep.empty()) p.block_keep_share = p.stage_block_keep[0];
  p.block_offload = run.memory.block_offload;
  // The link's host budget: offload's, and auto's, which may choose offload.
  if (p.block_offload || p.policy == MemoryPolicy::kAuto) p.host_budget_bytes = run.memory.host_budget_bytes;
  p.budget_bytes = run.memory.budget_bytes;
  p.eviction_threshold = run.memory.eviction_threshold;
  p.stages = run.grid.pipeline;
  p.schedule = run.pipeline.schedule;
  p.virtual_stages = static_cast<int>(run.pipeline.virtual_stages);
  if (p.stages > 1) p.stage_blocks.assign(run.pipeline.stage_blocks.begin(), run.pipeline.stage_blocks.end());
  p.state_on_host = run.memory.optimizer_state == StatePlace::kHost;
  p.plan_first_step = run.memory.plan_first_step;
  p.shard = c.parallel.shard;
  p.prefetch = static_cast<int>(run.sync.prefetch);
  p.overlap = run.sync.overlap;
  p.tensor = run.grid.tensor;
  p.sequence_parallel = run.grid.sequence_parallel;
  p.context = run.grid.context;
  p.context_exchange = c.parallel.context_exchange;
  p.async_checkpoint = c.checkpoint.async && c.checkpoint.interval > 0;
  return p;
}

// memory.policy = "auto"'s choice: a policy, where the optimizer state lives, and what eviction
// keeps free (memory.eviction_threshold; 0: as configured).
struct MemoryChoice {
  MemoryPolicy policy = MemoryPolicy::kAuto;
  bool state_on_host = false;
  double threshold = 0;
  bool block_offload = false;   // per_block: memory.block_offload
  double block_keep_share = 0;  // per_block: the share fastest_block_keep chose (0: keep none)
  std::string shares;           // per_block: each share's predicted step, for the log
};

// memory.policy = "auto" under a budget: of the policies this plan could train under, the one
// predicted fastest among those that fit (a fitting plan without eviction is the fastest), so
// that a user who sets only a budget trains the cheapest way the planner knows. Static plans
// are auto's own (a plan once a sequence repeats), so kAuto stands for them; sharding rules out
// what the search rules out (planner/search.cpp). Per-block plans come at the share
// fastest_block_keep picks, and with offload to host where `host_link` (CPU ranks: on a GPU the
// planner does not price the CUDA host link's copies yet, so neither offload nor swap is offered). Host memory counts too: hybrid with the optimizer state on host
// (memory.optimizer_state = "host") is a candidate where no sharding is set; and DTR evicting
// only what each kernel needs (memory.eviction_threshold = 1.0, no tenth of the budget kept free:
// cheaper at small budgets, measured in memory.md), after DTR as configured (a tie goes to the
// earlier: per_block keeping none ties full, and full is trained). `words`: each candidate's
// predicted step.
MemoryChoice fastest_memory_policy(const JobPlan& plan, const Plan& configured, bool host_link, std::string& words) {
  MemoryChoice per_block{MemoryPolicy::kPerBlock}, offload{MemoryPolicy::kPerBlock};
  offload.block_offload = true;
  const MemoryChoice candidates[] = {{MemoryPolicy::kNone},         {MemoryPolicy::kAuto},
                                     {MemoryPolicy::kFull},         per_block,
                                     offload,                       {MemoryPolicy::kDtr},
                                     {MemoryPolicy::kDtr, false, 1.0}, {MemoryPolicy::kHybrid},
                                     {MemoryPolicy::kHybrid, true}};
  auto predict_plan = [&](const Plan& q) { return predict(plan.profile, plan.machine, q); };
  MemoryChoice best;  // none fits: the configured auto, refused below
  std::optional<double> best_ms;
  for (MemoryChoice choice : candidates) {
    const bool link = uses_host_link(choice.policy, choice.block_offload);
    if (configured.shard >= ShardLevel::kGradients && plans_statically(choice.policy)) continue;
    if (configured.shard == ShardLevel::kParameters && link) continue;
    if (link && !host_link) continue;
    if (choice.state_on_host && configured.shard != ShardLevel::kNone) continue;
    if (choice.threshold > 0 && choice.threshold == configured.eviction_threshold) continue;
    Plan q = configured;
    q.policy = choice.policy;
    q.state_on_host = choice.state_on_host;
    q.block_offload = choice.block_offload;
    q.block_keep_bytes = 0;
    q.stage_block_keep.clear();
    if (choice.threshold > 0) q.eviction_threshold = choice.threshold;
    if (choice.policy == MemoryPolicy::kPerBlock) {  // its shares said for the chosen one only
      choice.block_keep_share = q.block_keep_share = fastest_block_keep(q, predict_plan, choice.shares);
    }
    const Prediction p = predict_plan(q);
    char threshold[48] = "";
    if (choice.threshold > 0) std::snprintf(threshold, sizeof threshold, " evicting down to %.0f%%", 100 * choice.threshold);
    char share[48] = "";
    if (choice.policy == MemoryPolicy::kPerBlock && p.fits) {
      std::snprintf(share, sizeof share, " keeping %.0f%%", 100 * choice.block_keep_share);
    }
    char cell[192];
    std::snprintf(cell, sizeof cell, "%s%s%s%s%s%s %s", words.empty() ? "" : ", ",
                  choice.policy == MemoryPolicy::kAuto ? "static" : choice_name(choice.policy),
                  choice.block_offload ? " with offload" : "", share,
                  choice.state_on_host ? " with the optimizer state on host" : "", threshold,
                  p.fits ? (std::to_string(static_cast<int64_t>(p.step_ms + 0.5)) + " ms").c_str() : "does not fit");
    words += cell;
    if (p.fits && (!best_ms || p.step_ms < *best_ms)) {
      best = choice;
      best_ms = p.step_ms;
    }
  }
  return best;
}

// Rank 0's decision, in numbers every rank can apply: refuse?, micro-batch size, policy, budget.
struct Decision {
  bool refuse = false;
  int64_t micro_batch = 0;
  MemoryPolicy policy = MemoryPolicy::kNone;
  int64_t budget_bytes = 0;
  ShardLevel shard = ShardLevel::kNone;
  int64_t prefetch = 1;
  bool state_on_host = false;
  int64_t threshold_permille = 900;  // memory.eviction_threshold
  int64_t block_keep_permille = 0;   // per_block: the share each block keeps (0: as configured)
  bool block_offload = false;        // per_block: memory.block_offload (memory.policy = "auto"'s choice)
  // training.gradient_dtype as the plan was predicted with it (auto: a searched plan that fits
  // only with bf16 gradients has them).
  GradientDtype gradient_dtype = GradientDtype::kAuto;
};

Decision share(const ProcessGrid& grid, Decision d) {
  if (grid.world <= 1) return d;
  at::Tensor t = at::tensor({static_cast<int64_t>(d.refuse), d.micro_batch, static_cast<int64_t>(d.policy),
                             d.budget_bytes, static_cast<int64_t>(d.shard), d.prefetch,
                             static_cast<int64_t>(d.state_on_host), d.threshold_permille, d.block_keep_permille,
                             static_cast<int64_t>(d.block_offload), static_cast<int64_t>(d.gradient_dtype)},
                            at::kLong);
  // Rank 0's group first, then each replica's first rank to its group (without a tensor-parallel
  // group, the one broadcast).
  if (grid.tensor_parallel > 1) grid.tensor_parallel_group->broadcast(t, 0, "the plan of rank 0");
  grid.data_parallel_group->broadcast(t, 0, "the plan of rank 0");
  if (grid.tensor_parallel > 1) grid.tensor_parallel_group->broadcast(t, 0, "the plan of rank 0");
  return {t[0].item<int64_t>() != 0, t[1].item<int64_t>(), static_cast<MemoryPolicy>(t[2].item<int64_t>()),
          t[3].item<int64_t>(), static_cast<ShardLevel>(t[4].item<int64_t>()), t[5].item<int64_t>(),
          t[6].item<int64_t>() != 0, t[7].item<int64_t>(), t[8].item<int64_t>(), t[9].item<int64_t>() != 0,
          static_cast<GradientDtype>(t[10].item<int64_t>())};
}

// The plan as configured, as a decision: what "auto" trains where rank 0 could not plan (a GPU
// whose trace failed: warned, never refused).
Decision configured(const RunPlan& run) {
  return {false, run.batch.micro, run.memory.policy, run.memory.budget_bytes, run.sync.shard, run.sync.prefetch,
          false, std::lround(run.memory.eviction_threshold * 1000), std::lround(run.memory.block_keep_share * 1000),
          run.memory.block_offload, run.gradient_dtype};
}

// parallel.strategy = "auto": the plan trains rank 0's choice.
void apply(RunPlan& run, const Decision& d) {
  const int64_t local = run.batch.local();
  run.batch.micro = d.micro_batch;
  run.batch.micro_batches = local / d.micro_batch;
  run.memory.policy = d.policy;
  run.sync.shard = run.grid.data > 1 ? d.shard : ShardLevel::kNone;
  if (d.shard == ShardLevel::kParameters) run.sync.prefetch = d.prefetch;
  run.memory.budget_bytes = d.budget_bytes;
  run.gradient_dtype = d.gradient_dtype;
  // The chosen plan's share of each block, over a configured one (the plan was predicted with it);
  // an offloading plan's none too (every stage's 0%, below), over a configured share (a configured
  // plan in bytes or per stage, trained where no searched plan fits, stays).
  const bool keeps_none_offloading = d.block_offload && d.block_keep_permille == 0 &&
                                     run.memory.block_keep_bytes == 0 && run.memory.stage_block_keep.empty();
  if (d.policy == MemoryPolicy::kPerBlock && (d.block_keep_permille > 0 || keeps_none_offloading)) {
    run.memory.block_keep_bytes = 0;
    run.memory.block_keep_share = static_cast<double>(d.block_keep_permille) / 1000;
  }
  // Offload as the plan has it (the search offers it on CPU ranks), over half the host's available
  // memory where the config opened no host link (the planner's block_link_of assumes the same).
  run.memory.block_offload = d.policy == MemoryPolicy::kPerBlock && d.block_offload;
  if (run.memory.block_offload && run.memory.host_budget_bytes <= 0) {
    run.memory.host_budget_bytes = host_available_memory_bytes() / 2;
  }
}

// Rank 0's plan of a run of stages or tensor-parallel groups: `predict` with the config planned
// here (profiled on CPU ranks, traced at the local GPU's kind on a GPU). On a GPU a failure to plan
// is said in `out.text` and the run trains (under parallel.strategy = "auto", a tensor-parallel run
// as configured; pipelined runs take no "auto"); on CPU ranks it is thrown.
template <typename Predict>
void plan_grid_on_root(const Config& config, const RunPlan& run, const ProcessGrid& grid, RunPrediction& out,
                       Predict&& predict_with) {
  std::string why;
  try {
    if (std::optional<Config> planned = planned_here(config, run, grid, why)) {
      predict_with(*planned);
      return;
    }
  } catch (const std::exception& e) {
    if (config.training.device == "cpu") throw;
    why = e.what();
  }
  out.prediction.peak_bytes = -1;
  out.prediction.step_ms = -1;
  out.text = "predicted: nothing on " + config.training.device + " (" + why + ")";
}

// A run whose layers are split (tensor parallelism; context parallelism's sequences) without
// stages: rank 0's part of the model profiled with its groups mirrored, the groups' exchanges
// modelled (planner/tensor_terms.h, planner/context_terms.h). Predicted for the log and the
// metrics, never refused; with parallel.strategy = "auto", the fastest plan that fits at these
// group sizes (micro-batch, memory policy and budget, sharding level) is trained.
RunPrediction predict_split_layers_run(const Config& config, RunPlan& run, const DataSplits& data,
                                          const ProcessGrid& grid) {
  RunPrediction out;
  const bool automatic = config.parallel.strategy == Strategy::kAuto;
  Decision decision = configured(run);
  if (grid.is_root()) plan_grid_on_root(config, run, grid, out, [&](const Config& planned) {
    PlanArgs args;
    args.ranks = {run.grid.data * run.grid.tensor * run.grid.context};
    // The host's cores are the ranks' (rank 0 alone may be bound to one of them).
    args.ranks_on_host = grid.local_size;
    args.stages = {1};
    args.tensor = {run.grid.tensor};
    args.context = {run.grid.context};
    args.device_memory = run.memory.budget_bytes;
    args.precisions = {run.precision};
    if (!automatic) args.policies = {MemoryPolicy::kNone};
    if (config.training.device != "cpu" && !cuda_budgets_built()) args.policies = {MemoryPolicy::kNone};
    if (!automatic) args.trained_sizes = {run.batch.micro};
    if (!automatic || config.parallel.shard != ShardLevel::kNone) args.shards = {config.parallel.shard};
    const JobPlan plan = plan_job(planned, data.train.get(), data.info, args);
    out.limit_bytes = plan.machine.device_memory;
    out.plan = plan_of(config, run);
    if (automatic && !plan.ranked.empty() && plan.ranked[0].prediction.fits) out.plan = plan.ranked[0].plan;
    out.prediction = predict(plan.profile, plan.machine, out.plan);
    decision = {false, out.plan.micro_batch, out.plan.policy,
                evicts(out.plan.policy) ? out.limit_bytes : run.memory.budget_bytes, out.plan.shard,
                out.plan.prefetch, false, std::lround(run.memory.eviction_threshold * 1000),
                std::lround(out.plan.block_keep_share * 1000), false, out.plan.gradient_dtype};
    char text[320];
    std::snprintf(text, sizeof text, "predicted: peak %s per rank, step %.1f ms of which %.1f ms in the %s's exchanges "
                  "(%s; never refused)", format_bytes(out.prediction.peak_bytes).c_str(), out.prediction.step_ms,
                  out.prediction.tensor_ms + out.prediction.context_ms,
                  run.grid.context == 1 ? "tensor-parallel group" : run.grid.tensor == 1 ? "context-parallel group"
                                                                                          : "tensor- and context-parallel groups",
                  plan_words(out.plan).c_str());
    out.text = text;
  });
  // The others sleep while rank 0 profiles (each group's first rank waits with rank 0's replicas).
  if (grid.world > 1) {
    grid.data_parallel_group->idle_barrier("the plan of rank 0");
    grid.tensor_parallel_group->idle_barrier("the plan of rank 0");
  }
  if (automatic) apply(run, share(grid, decision));
  return out;
}

// A pipelined run: predicted for the log and the metrics, never refused: the pipeline terms model
// the schedule's stages without DTR's evictions (planner/pipeline_terms.h); on a GPU from the trace
// at the local GPU's kind, its messages played on NCCL's serial streams.
RunPrediction predict_pipeline_run(const Config& config, const RunPlan& run, const DataSplits& data,
                                   const ProcessGrid& grid) {
  RunPrediction out;
  out.prediction.peak_bytes = -1;
  if (grid.is_root()) plan_grid_on_root(config, run, grid, out, [&](const Config& planned) {
    PlanArgs args;
    args.ranks = {run.grid.world()};
    args.stages = {run.grid.pipeline};
    args.tensor = {run.grid.tensor};  // a stage's rank holds its part
    args.context = {run.grid.context};
    args.device_memory = run.memory.budget_bytes;
    args.precisions = {run.precision};
    args.policies = {MemoryPolicy::kNone};
    args.trained_sizes = {run.batch.micro};
    JobPlan plan = plan_job(planned, data.train.get(), data.info, args);
    // The stages' messages as this run's group carries them: ranks sharing a GPU use MPI's.
    plan.machine.p2p_in_posting_order = run.pipeline.posting_order;
    out.plan = plan_of(config, run);
    // Full and per-block recomputation (per stage too) are replayed block by block; DTR's
    // evictions on a stage are not modelled: predicted without them.
    const bool replayed = recomputes_blocks(run.memory.policy) && run.memory.budget_bytes > 0;
    if (!replayed) out.plan.policy = MemoryPolicy::kNone;
    out.prediction = predict(plan.profile, plan.machine, out.plan);
    char text[320];
    std::snprintf(text, sizeof text, "predicted: peak %s on the fullest stage, step %.1f ms with a bubble of %.1f ms "
                  "(%s; %s)", format_bytes(out.prediction.peak_bytes).c_str(), out.prediction.step_ms,
                  out.prediction.bubble_ms, plan_words(out.plan).c_str(),
                  replayed || !evicts(config.memory.policy) ? "never refused" : "without the memory policy; never refused");
    out.text = text;
    if (out.prediction.stage_peak_bytes.size() > 1) {
      out.text += "; each stage's peak:";
      for (size_t r = 0; r < out.prediction.stage_peak_bytes.size(); ++r)
        out.text += (r > 0 ? ", " : " ") + format_bytes(out.prediction.stage_peak_bytes[r]);
    }
    if (replayed && !out.prediction.fits && config.memory.check_fit) {
      const std::string what = out.prediction.within_margin ? "memory.budget = \"" + config.memory.budget + "\" is tight"
                                                            : std::string("the run is predicted not to fit");
      std::fprintf(stderr, "hybrid_train: warning: %s: %s: %s; training anyway (pipeline stages are predicted, not "
                   "refused; a step that finds no room stops naming what it needed)\n",
                   config.source.c_str(), what.c_str(), out.prediction.why_not.c_str());
    }
  });
  return out;
}

}  // namespace

RunPrediction check_run_fits(const Config& config, RunPlan& run, const DataSplits& data, const ProcessGrid& grid) {
  RunPrediction out;
  const bool gpu = config.training.device != "cpu";
  const bool split_layers = config.parallel.tensor_parallel > 1 || config.parallel.context_parallel > 1;
  if (split_layers && config.parallel.pipeline_parallel == 1) {
    return predict_split_layers_run(config, run, data, grid);
  }
  if (config.parallel.pipeline_parallel > 1) return predict_pipeline_run(config, run, data, grid);
  const bool automatic = config.parallel.strategy == Strategy::kAuto;
  Decision decision;
  std::optional<UserError> refusal;
  std::string chosen;  // memory.policy = "auto": each candidate's predicted step
  std::string kept;    // per_block without memory.block_keep: each share's
  bool share_chosen = false;  // memory.policy = "auto" chose per_block at its share
  const auto predict_on_root = [&](const Config& planned) {
    PlanArgs args;
    args.ranks = {run.grid.data};
    args.ranks_on_host = grid.local_size;
    args.stages = {1};  // the job's grid is fixed by now
    args.tensor = {run.grid.tensor};  // a traced plan would search tensor-parallel sizes too
    args.context = {run.grid.context};
    args.device_memory = run.memory.budget_bytes;
    args.precisions = {run.precision};
    if (!automatic) args.policies = {MemoryPolicy::kNone};  // the configured plan is predicted below
    if (gpu && !cuda_budgets_built()) args.policies = {MemoryPolicy::kNone};  // no arena to evict in
    if (!automatic) args.trained_sizes = {run.batch.micro};  // its own size: no search
    // Automatic: the planner picks the level, unless the config fixes one.
    if (!automatic || config.parallel.shard != ShardLevel::kNone) args.shards = {config.parallel.shard};
    JobPlan plan = plan_job(planned, data.train.get(), data.info, args);
    out.limit_bytes = plan.machine.device_memory;
    out.plan = plan_of(config, run);
    if (automatic && !plan.ranked.empty() && plan.ranked[0].prediction.fits) {
      out.plan = plan.ranked[0].plan;
    }
    if (!automatic && run.memory.policy == MemoryPolicy::kAuto && run.memory.budget_bytes > 0) {
      const MemoryChoice choice = fastest_memory_policy(plan, out.plan, config.training.device == "cpu", chosen);
      out.plan.policy = choice.policy;
      out.plan.state_on_host = choice.state_on_host;
      if (choice.threshold > 0) out.plan.eviction_threshold = choice.threshold;
      if (choice.policy == MemoryPolicy::kPerBlock) {
        out.plan.block_offload = choice.block_offload;
        out.plan.block_keep_bytes = 0;
        out.plan.block_keep_share = choice.block_keep_share;
        out.plan.stage_block_keep.clear();
        share_chosen = true;
        kept = choice.shares;  // memory.block_keep chosen by the predicted step: ...
      }
    }
    if (!share_chosen && out.plan.policy == MemoryPolicy::kPerBlock && out.plan.block_keep_bytes == 0 &&
        out.plan.block_keep_share == 0 && out.plan.stage_block_keep.empty() && out.limit_bytes > 0) {
      out.plan.block_keep_share =
          fastest_block_keep(out.plan, [&](const Plan& q) { return predict(plan.profile, plan.machine, q); }, kept);
    }
    out.prediction = predict(plan.profile, plan.machine, out.plan);
    // The fit check refuses what the replay cannot run; a step that runs only without the margin
    // kept for what the replay cannot see trains, with a warning (below): the engine trained such
    // budgets (issue 64: 95% of gpt_tiny's was refused, and it trained 8 steps in it).
    // On a GPU the trace declares no cuDNN or cuBLAS workspace: predicted and warned, never refused.
    if (gpu && !out.prediction.fits && config.memory.check_fit) {
      std::fprintf(stderr, "hybrid_train: warning: %s: predicted not to fit %s: %s; training anyway (on a GPU the "
                   "prediction is a trace's, without the libraries' workspaces)\n", config.source.c_str(),
                   config.training.device.c_str(), out.prediction.why_not.c_str());
    }
    if (!gpu && !out.prediction.fits && config.memory.check_fit && !out.prediction.within_margin) {
      // Alternatives at these ranks and this precision, eviction included, every size trained.
      args.policies = PlanArgs{}.policies;
      if (!args.trained_sizes.empty()) {
        args.trained_sizes.clear();
        plan = plan_job(planned, data.train.get(), data.info, args);
      }
      SearchOptions alternatives;
      alternatives.ranks = args.ranks;
      alternatives.precisions = {run.precision};
      alternatives.gradient_dtype = run.gradient_dtype;
      alternatives.async_checkpoint = out.plan.async_checkpoint;
      alternatives.policies = args.policies;
      alternatives.shards = {ShardLevel::kNone, ShardLevel::kOptimizer, ShardLevel::kGradients, ShardLevel::kParameters};
      const std::vector<Plan> plans =
          candidate_plans(config.training.global_batch_size, plan.machine.device_memory, alternatives);
      std::vector<RankedPlan> fitting;
      for (RankedPlan& r : rank_plans(plans, [&](const Plan& q) { return predict(plan.profile, plan.machine, q); },
                                      Objective::kTime, at::get_num_threads())) {
        if (r.prediction.fits) fitting.push_back(std::move(r));
      }
      refusal = does_not_fit(config, run, out.prediction, out.limit_bytes, fitting, chosen);
    }
    // A traced plan's arena is the device less what the runtime and NCCL hold (its budget_bytes).
    const int64_t evicting_budget = gpu && out.plan.budget_bytes > 0 ? out.plan.budget_bytes : out.limit_bytes;
    decision = {refusal.has_value(), out.plan.micro_batch, out.plan.policy,
                evicts(out.plan.policy) ? evicting_budget : run.memory.budget_bytes, out.plan.shard,
                out.plan.prefetch, out.plan.state_on_host,
                std::lround(out.plan.eviction_threshold * 1000), std::lround(out.plan.block_keep_share * 1000),
                out.plan.block_offload, out.plan.gradient_dtype};
  };
  std::string unplanned;  // on a GPU: why the run is not predicted
  if (grid.is_root()) {
    // On a GPU: traced at the local GPU's catalog kind, and a failure to plan is warned, never a
    // reason not to train (except under auto, which needs the plan).
    std::optional<Config> planned = planned_here(config, run, grid, unplanned);
    try {
      if (planned) predict_on_root(*planned);
    } catch (const std::exception& e) {
      if (!gpu) throw;
      unplanned = e.what();
      planned.reset();
    }
    if (!planned) {
      out.prediction.peak_bytes = -1;
      out.prediction.step_ms = -1;
      out.plan = plan_of(config, run);
      out.text = "predicted: nothing on " + config.training.device + " (" + unplanned + ")";
      if (automatic) {
        refusal = UserError(config.source + ": parallel.strategy = \"auto\" on training.device = \"" +
                            config.training.device + "\": " + unplanned + "; use parallel.strategy = \"manual\"");
      }
      decision = {refusal.has_value(), run.batch.micro, run.memory.policy, run.memory.budget_bytes, run.sync.shard,
                  run.sync.prefetch, run.memory.optimizer_state == StatePlace::kHost,
                  std::lround(run.memory.eviction_threshold * 1000), 0, run.memory.block_offload, run.gradient_dtype};
    }
  }
  // The other ranks sleep while rank 0 profiles: spinning in MPI, they took the cores its
  // measurements ran on (4 ranks on 2 cores: predicted steps off by 1.5-2.4x between two runs).
  if (grid.world > 1) grid.data_parallel_group->idle_barrier("the plan of rank 0");
  decision = share(grid, decision);
  if (decision.refuse) throw refusal ? *refusal : UserError("rank 0 found that the run cannot fit");
  if (automatic) {
    apply(run, decision);
  } else if (run.memory.policy == MemoryPolicy::kAuto && run.memory.budget_bytes > 0) {
    run.memory.policy = decision.policy;  // kAuto itself where its static plans won
    if (decision.state_on_host) run.memory.optimizer_state = StatePlace::kHost;
    if (decision.threshold_permille != std::lround(run.memory.eviction_threshold * 1000)) {
      run.memory.eviction_threshold = static_cast<double>(decision.threshold_permille) / 1000;
    }
    if (decision.policy == MemoryPolicy::kPerBlock) {  // at the share below
      run.memory.block_offload = decision.block_offload;
      run.memory.block_keep_bytes = 0;
      run.memory.block_keep_share = 0;
      run.memory.stage_block_keep.clear();
    }
  }
  if (run.memory.policy == MemoryPolicy::kPerBlock && run.memory.block_keep_bytes == 0 &&
      run.memory.block_keep_share == 0 && run.memory.stage_block_keep.empty()) {
    // Keeping none is full recomputation: trained as such, and written so in the resolved config;
    // with offload, what the plan offloads goes to host (every stage's 0%).
    if (decision.block_keep_permille == 0 && run.memory.block_offload) {
      run.memory.stage_block_keep.assign(static_cast<size_t>(run.grid.pipeline), 0.0);
    } else if (decision.block_keep_permille == 0) {
      run.memory.policy = MemoryPolicy::kFull;
    }
    run.memory.block_keep_share = static_cast<double>(decision.block_keep_permille) / 1000;
  }
  if (grid.is_root()) {
    char text[256];
    std::snprintf(text, sizeof text, "predicted: peak %s per rank of %s, step %.1f ms (%s)",
                  format_bytes(out.prediction.peak_bytes).c_str(), format_bytes(out.limit_bytes).c_str(),
                  out.prediction.step_ms, plan_words(out.plan).c_str());
    out.text = text;
    if (out.prediction.checkpoint_host_bytes > 0) {
      out.text += "; an async checkpoint's copy holds " + format_bytes(out.prediction.checkpoint_host_bytes) +
                  " of host memory while it is written";
    }
    if (!chosen.empty()) out.text += "; memory.policy = \"auto\" chose by the predicted step: " + chosen;
    if (!kept.empty()) out.text += "; memory.block_keep chosen by the predicted step: " + kept;
    if (out.prediction.within_margin && config.memory.check_fit) {
      std::fprintf(stderr, "hybrid_train: warning: %s: memory.budget = \"%s\" is tight: %s; training anyway (the "
                   "replay matches the engine's arena; a step that finds no room stops naming what it needed)\n",
                   config.source.c_str(), config.memory.budget.c_str(), out.prediction.why_not.c_str());
    }
  }
  return out;
}

}  // namespace ht

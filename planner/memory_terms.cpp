#include "planner/memory_terms.h"

#include "alloc/byte_size.h"
#include "planner/dtr_replay.h"
#include "planner/gradient_blocks.h"
#include "planner/shard_terms.h"
#include "planner/swap_terms.h"
#include "planner/weight_copy_terms.h"
#include "schedule/checkpoint_segments.h"
#include "schedule/solver.h"

#include <algorithm>

namespace ht {
namespace {

// memory.optimizer_state = "host" takes effect only where the run opens a host link.
bool state_waits_on_host(const Plan& plan) {
  return plan.state_on_host && swaps(plan.policy);
}

// Memory per rank without eviction: every term exact but the activations, which are measured.
void memory_terms(const ModelProfile& profile, const Plan& plan, Prediction& p) {
  const int64_t local = plan.micro_batch * plan.accumulation;
  p.model_bytes = profile.parameter_bytes;
  p.gradient_bytes = gradient_block_bytes(profile, plan);
  p.optimizer_state_bytes = profile.optimizer_state_bytes;
  p.sampler_bytes = sampler_bytes(profile.train_samples);
  p.batch_bytes = batch_bytes(profile, local);
  p.activation_bytes = activation_bytes(profile, plan.micro_batch, plan.precision);
  p.optimizer_working_bytes = optimizer_working_bytes(profile, plan.precision);
  p.peak_bytes = p.working_peak_bytes();
}

// Under a budget with eviction: the recorded step replayed through the policy at the budget.
void eviction_terms(const ModelProfile& profile, const Machine& machine, const Plan& plan, double slowdown, Prediction& p) {
  ReplayOptions options;
  options.budget_bytes = plan.budget_bytes;
  options.policy = *eviction_heuristic(plan.policy);
  const bool link = uses_host_link(plan.policy, plan.block_offload);
  options.window = !link;  // as the engine: with a host link, no windows (memory_manager.cpp)
  // Host swap keeps a tenth free; planned offload takes the threshold as set (MemoryManager::threshold).
  options.eviction_threshold = swaps(plan.policy) ? std::min(0.9, plan.eviction_threshold) : plan.eviction_threshold;
  if (recomputes_blocks(plan.policy)) options.checkpoint_blocks = static_cast<int>(profile.block_parameter_bytes.size());
  if (plan.policy == MemoryPolicy::kPerBlock) {
    options.block_keep_bytes = plan.block_keep_bytes;
    options.block_keep_share = plan.block_keep_share;
    options.block_link = block_link(profile, machine, plan);  // off without memory.block_offload
  }
  StepTrace trace = trace_for(profile, plan.micro_batch, plan.micro_batch * plan.accumulation, plan.precision);
  const int64_t state_on_host = state_waits_on_host(plan) ? p.optimizer_state_bytes : 0;
  trace.persistent_bytes = p.state_bytes() - state_on_host + p.sampler_bytes;
  // Sharded, the optimizer steps pieces: its temporaries are shard_memory_terms', not the trace's.
  const bool sharded = plan.shard != ShardLevel::kNone && plan.weight_replicas() > 1;
  if (sharded) trace = without_optimizer_phase(trace);
  const ReplayResult r = replay_step(trace, options);
  // What the replay cannot see (the temporaries of kernels it re-runs, the arena as earlier steps
  // left it) can cut the last few percent into pieces: a plan fits only if the replay also runs
  // with 5% less.
  ReplayOptions tighter = options;
  tighter.budget_bytes = options.budget_bytes * 95 / 100;
  const ReplayResult margin = replay_step(trace, tighter);
  const int64_t optimizer_peak = p.fixed_bytes() + p.optimizer_working_bytes;
  p.peak_bytes = r.feasible ? r.peak_bytes : std::max(p.peak_bytes, r.min_budget_bytes);
  if (sharded) p.peak_bytes = std::max(p.peak_bytes, optimizer_peak);
  // The optimizer's step holds all of the state, beside the parameters and their gradients.
  if (state_waits_on_host(plan)) p.peak_bytes = std::max(p.peak_bytes, p.state_bytes() + p.sampler_bytes);
  p.evictions = r.evictions * plan.accumulation;
  if (options.block_link.on()) {  // the blocks' offloads, on the link as host swap's are counted
    const auto micro = static_cast<double>(plan.accumulation);
    p.swap_out_bytes = r.offload_out_bytes * plan.accumulation;
    p.swap_link_ms = static_cast<double>(r.offload_out_bytes + r.offload_in_bytes) * options.block_link.ms_per_byte * micro;
    p.swap_exposed_ms = r.offload_exposed_ms * micro;
  }
  p.recompute_ms = r.recompute_ms * static_cast<double>(plan.accumulation) * slowdown;
  if (r.feasible && !margin.feasible) {
    p.fits = false;
    p.within_margin = true;
    p.why_not = "eviction runs it in " + format_bytes(options.budget_bytes) + " but not in 95% of it (" +
                format_bytes(tighter.budget_bytes) + "), the margin kept for fragmentation the replay cannot see: " +
                margin.failure;
  } else if (!r.feasible) {
    p.fits = false;
    p.why_not = "eviction cannot run it: " + r.failure;
  }
}

// Under static plans (memory/static_plan.h), as the runtime runs them: with memory.plan_first_step
// (one rank's whole model) the step is planned before it runs, so a plan that fits is the
// prediction whether DTR could run the step or not; without it the first step of a sequence (two
// under auto) runs under DTR while it is captured, so nothing is planned unless DTR can run that
// step. A sequence no plan fits stays under DTR: DTR's replay is the prediction then. Otherwise
// the profiled step's graph at the plan's micro-batch is planned for the budget less the
// runtime's margin, by the solver's heuristic (the search predicts many plans; the MIP would take
// seconds each and improves on it by a few percent where it does), and the plan's simulated peak
// and recomputation are the step's. `segments` plans checkpoint_sequential's
// schedule whatever the budget; above the budget DTR is its safety net, predicted by the replay.
void static_plan_terms(const ModelProfile& profile, const Machine& machine, const Plan& plan, double slowdown, Prediction& p) {
  eviction_terms(profile, machine, plan, slowdown, p);
  const bool ahead = plan.plan_first_step && plan.stages == 1 && plan.tensor == 1 && plan.context == 1 &&
                     !(plan.shard == ShardLevel::kParameters && plan.weight_replicas() > 1);
  // DTR's verdict on the first step, which stands where no plan is made before it.
  const auto under_dtr = [&] {
    if (!p.fits) p.why_not = "the first step, which runs under DTR while it is captured for a plan: " + p.why_not;
  };
  if (!p.fits && !ahead) return under_dtr();
  std::vector<int> block_starts;
  schedule::StepGraph graph = graph_for(profile, plan.micro_batch, plan.precision, &block_starts);
  if (graph.forward.empty()) return under_dtr();  // no graph was captured: DTR's prediction stands
  graph.fixed_bytes = p.fixed_bytes();
  const auto budget = static_cast<int64_t>(static_cast<double>(plan.budget_bytes) * (1.0 - schedule::kDefaultBudgetMargin));
  schedule::Schedule chosen;
  schedule::ScheduleCost cost;
  if (plan.policy == MemoryPolicy::kSegments) {
    chosen = schedule::checkpoint_segments(graph, block_starts);
    cost = schedule::simulate(graph, chosen);
    if (!cost.valid || cost.peak_bytes > plan.budget_bytes) return under_dtr();
  } else {
    schedule::SolveOptions options;
    options.budget_bytes = budget;
    options.use_mip = false;
    // Weighed as the run weighs it (memory.kernel_costs = "modeled", the default), timed as measured.
    schedule::SolveResult r = schedule::solve(schedule::weighed_by_model(graph), options);
    if (r.status == schedule::SolveStatus::kInfeasible) return under_dtr();
    chosen = std::move(r.schedule);
    cost = schedule::simulate(graph, chosen);
  }
  // Evictions are the values backward needs that the plan drops; every schedule frees the rest
  // after their last forward use, as a run without a budget does.
  int64_t dropped = 0;
  for (size_t v = 0; v < graph.values.size(); ++v) {
    dropped += graph.values[v].droppable && !chosen.keep[v] && graph.last_backward_read[v] >= 0;
  }
  p.peak_bytes = cost.peak_bytes;
  p.recompute_ms = cost.recompute_ms * static_cast<double>(plan.accumulation) * slowdown;
  p.evictions = dropped * plan.accumulation;
  p.static_plan = true;
  p.fits = true;  // planned ahead: what DTR could not run, the plan runs from the first step
  p.within_margin = false;
  p.why_not.clear();
}

}  // namespace

schedule::BlockLink block_link_of(const Machine& machine, const Plan& plan, int blocks) {
  schedule::BlockLink link;
  link.ms_per_byte = 1.0 / (machine.host_link_gbps * 1e6);
  const int64_t host = plan.host_budget_bytes > 0 ? plan.host_budget_bytes : machine.host_memory / 2;
  link.host_bytes = host / std::max(1, blocks - 1);
  return link;
}

// The state's memory: parameters, gradients, optimizer state, batch and activations, sharded as the
// plan shards them, and without a gradient block the gradients as backward makes them.
void state_memory_terms(const ModelProfile& profile, const Plan& plan, Prediction& p) {
  memory_terms(profile, plan, p);
  if (walks_without_casts(plan) && !profile.points.empty()) {
    // Kept 16-bit copies: no cast and no cast's fp32 gradient in the step (the copies themselves
    // are resident: weight_copy_memory_terms).
    p.activation_bytes = std::max<int64_t>(0, p.activation_bytes + activations_without_casts_change(profile, plan));
    p.peak_bytes = p.working_peak_bytes();
  }
  const bool along_the_step = (plan.shard == ShardLevel::kParameters || plan.shard == ShardLevel::kGradients) &&
                              plan.weight_replicas() > 1 && !profile.points.empty();
  if (along_the_step) {
    // Made only where a walk along it is not known yet (shard_memory_terms). At one micro-batch's
    // batch: the walks read what they add above the trace's own peak, and the batch, allocated
    // before the first kernel and held to the end, adds the same to both; so a micro-batch's walks
    // share one trace (and the recent traces hold it) whatever the plan accumulates.
    const TraceMaker step = [&] { return shared_trace_for(profile, plan.micro_batch, plan.micro_batch, plan.precision); };
    shard_memory_terms(profile, plan, p, &step);
  } else {
    shard_memory_terms(profile, plan, p);
  }
  if (keeps_gradients_as_made(plan) && !profile.points.empty()) kept_gradient_terms(profile, plan, p);
}

// The memory policy's terms: full recomputation's blocks replayed (`blocks`, where they are: what
// fails), a budget's eviction (a static plan, or the replay of the step) and host swap.
void policy_terms(const ModelProfile& profile, const Machine& machine, const Plan& plan, double slowdown,
                  const BlockRecomputeReplay* blocks, Prediction& p) {
  if (blocks != nullptr) {
    if (!blocks->failure.empty()) {
      p.fits = false;
      p.why_not = "a micro-batch's activations with every block recomputed do not fit: " + blocks->failure;
      p.peak_bytes = std::max(p.peak_bytes, p.fixed_bytes() + blocks->min_budget_bytes);
    }
  } else if (evicts(plan.policy) && plan.budget_bytes > 0) {
    if (plans_statically(plan.policy)) {
      static_plan_terms(profile, machine, plan, slowdown, p);
    } else {
      eviction_terms(profile, machine, plan, slowdown, p);
    }
    if (swaps(plan.policy)) {
      const SharedTrace trace = shared_trace_for(profile, plan.micro_batch, plan.micro_batch * plan.accumulation, plan.precision);
      swap_terms(*trace, plan.policy, machine, slowdown, p.evictions > 0, plan.accumulation, p);
      if (state_waits_on_host(plan)) {  // out after the step and back before the next, waited for
        const double state_ms = 2.0 * static_cast<double>(p.optimizer_state_bytes) / (machine.host_link_gbps * 1e6);
        p.swap_link_ms += state_ms;
        p.swap_exposed_ms += state_ms;
      }
    }
  }
}

}  // namespace ht

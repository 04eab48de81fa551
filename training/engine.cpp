#include "training/engine.h"

#include "alloc/cpu_device_allocator.h"
#include "alloc/cuda_arena.h"

#include <algorithm>

namespace ht {

MemoryOptions memory_options(const MemoryPlan& m, uint64_t seed, std::shared_ptr<CpuArena> arena,
                             std::shared_ptr<HostLink> link, int blocks) {
  MemoryOptions options;
  options.arena = arena;
  options.eviction_threshold = m.eviction_threshold;
  if (!arena || !evicts(m.policy)) return options;
  if (plans_statically(m.policy)) {
    StaticPlanOptions plans;
    plans.source = m.policy == MemoryPolicy::kSegments ? PlanSource::kSegments : PlanSource::kSolver;
    plans.sightings_before_planning = m.policy == MemoryPolicy::kAuto ? 2 : 1;
    plans.solve_time_limit_s = m.solve_time_s;
    // The heuristic alone weighs modelled costs: the same plan every run. The MIP weighs measured
    // times (docs/status.md, "What is not built yet": with modelled ones, ResNet-18's plan replays badly).
    plans.modeled_costs = m.solve_time_s == 0 && m.kernel_costs == KernelCosts::kModeled;
    plans.static_layout = m.static_layout;
    options.static_plans = plans;
  }
  EvictionOptions eviction;  // DTR: the policy, or the safety net and fallback of static plans
  eviction.heuristic = *eviction_heuristic(m.policy);
  if (m.uses_host_link()) {
    SwapOptions swap;
    swap.rule = m.policy == MemoryPolicy::kSwap     ? SwapRule::kConvAndMatmul
                : m.policy == MemoryPolicy::kHybrid ? SwapRule::kHidden
                                                    : SwapRule::kPlanned;
    swap.link = std::move(link);
    swap.host_budget_bytes = m.host_budget_bytes;
    // A plan's offloads are chosen whole: a small value left on the device would run its op again
    // (attention's 32 KiB of statistics, beside its output offloaded).
    if (swap.rule == SwapRule::kPlanned) swap.min_bytes = 0;
    swap.bf16_on_link = m.compress == Compression::kBf16;
    options.swap = swap;
  }
  eviction.sqrt_sampling = m.sqrt_sampling;
  eviction.ignore_small = m.ignore_small;
  eviction.window = m.eviction_window;
  eviction.costs = m.kernel_costs;
  eviction.seed = seed;
  options.eviction = eviction;
  if (recomputes_blocks(m.policy)) options.checkpoint_blocks = blocks;
  if (m.policy == MemoryPolicy::kPerBlock) {
    options.block_keep_bytes = m.block_keep_bytes;
    options.block_keep_share = m.block_keep_share;
    // Left out where no run check chose (a GPU, stages, tensor parallelism): half of each block.
    // A stage's share of 0 (memory.block_keep per stage, or "0%") keeps nothing on the device: its
    // full recomputation, or with memory.block_offload what its plan offloads.
    if (m.block_keep_bytes == 0 && m.block_keep_share == 0 && m.stage_block_keep.empty())
      options.block_keep_share = MemoryPlan::kDefaultBlockKeepShare;
  }
  return options;
}

// A tensor-parallel group's ranks choose alike what to evict only under DTR with modelled costs;
// under any other policy collectives' outputs stay, and recomputations stop at them.
bool keeps_collectives(const RunPlan& plan) {
  const MemoryPlan& m = plan.memory;
  return plan.grid.tensor > 1 &&
         (plans_statically(m.policy) || m.uses_host_link() || m.kernel_costs == KernelCosts::kMeasured);
}

Engine::Engine(const RunPlan& plan, std::shared_ptr<Model> model_, std::shared_ptr<CpuArena> arena_)
    : model(std::move(model_)), arena(std::move(arena_)), device(plan.device),
      interp(InterpreterOptions{ExecutionMode::kInterpreted, plan.seed}, &memory) {
  interp.set_autocast(autocast_type(plan.precision));
  interp.set_relu_masks(plan.memory.compress != Compression::kOff);
  interp.set_keep_collectives(keeps_collectives(plan));
  if (!arena && device.is_cuda()) {
    library_workspace_bytes = std::max<int64_t>(0, make_cuda_library_workspaces(device.has_index() ? device.index() : 0));
  }
}

int64_t Engine::device_peak_bytes() const {
  if (arena) return arena->stats().peak_in_use;
  if (device.is_cpu()) return CpuAllocationCounter::install().device_peak_bytes();
  if (device.is_cuda()) return cuda_allocated_peak_bytes(device.has_index() ? device.index() : 0) - library_workspace_bytes;
  return -1;
}

void Engine::reset_device_peak() {
  CpuAllocationCounter::install().reset_peak();
  if (arena) {
    arena->reset_peak();
  } else if (device.is_cuda()) {
    reset_cuda_allocated_peak(device.has_index() ? device.index() : 0);
  }
}

}  // namespace ht

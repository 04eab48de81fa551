#include "launcher/planning/first_step_plan.h"
#include "base/clock.h"

#include "launcher/model_factory.h"
#include "launcher/planning/meta_trace.h"
#include "runtime/traced_device.h"
#include "alloc/byte_size.h"
#include "alloc/cpu_arena.h"
#include "alloc/gradient_buffer.h"
#include "alloc/meta_arena.h"
#include "memory/memory_manager.h"
#include "memory/static_plan.h"
#include "models/layers.h"
#include "runtime/kernel_workspace.h"

#include <ATen/CPUGeneratorImpl.h>

#include <chrono>
#include <cstdio>
#include <exception>

namespace ht {
namespace {

bool traceable_as_run(const RunPlan& plan, const Model& model) {
  return plan.memory.plan_first_step && plan.grid.pipeline == 1 && plan.grid.tensor == 1 && plan.grid.context == 1 &&
         plan.sync.shard != ShardLevel::kParameters && !model.changes_every_step();
}

// Whether the optimizer's whole state lives in the device memory between steps (not on host, not
// a share of it).
bool state_in_device_memory(const RunPlan& plan) {
  return plan.memory.optimizer_state != StatePlace::kHost && plan.sync.shard == ShardLevel::kNone;
}

}  // namespace

CapturedStep trace_step_for_plan(const Config& config, const std::function<std::shared_ptr<Model>()>& make,
                                 const std::function<std::pair<at::Tensor, at::Tensor>()>& batch, bool with_state) {
  // The trace draws nothing the run's stream should see: the default generator is put back,
  // also when the trace throws.
  struct GeneratorKept {
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    const at::Tensor state = generator.get_state();
    ~GeneratorKept() { generator.set_state(state); }
  } kept;
  // On a CPU rank the kernels' own workspaces (im2col, reorders) are traced as measured here.
  const TracedForGpu traced_for(at::Device(config.training.device).is_cuda());
  const DeclaredWorkspaces declared(at::Device(config.training.device).is_cpu() ? WorkspaceRules::kThisCpu
                                                                               : WorkspaceRules::kNone);
  const std::shared_ptr<CpuArena> arena = make_meta_arena(int64_t{1} << 45);
  MetaArenaScope scope(arena);
  std::shared_ptr<Model> model;
  {
    MetaParametersScope on_meta;
    model = make();
  }
  // Gradients into one block, as the trainer's under a budget (their bytes are the step's fixed
  // ones), in the run's type (training.gradient_dtype).
  const GradientBuffer gradients(model->parameters(), floating_gradient_type(config.training.gradient_dtype,
                                                                            config.training.mixed_precision));
  TraceExtras extras;
  extras.gradients = &gradients;
  extras.capture_graph = true;
  TracedStep step;
  const auto [x, y] = batch();
  trace_forward_backward(config, *model, arena, x, y, step, &extras);
  // The optimizer's state appears after the first step and stays: planned for from the start, the
  // plan and the layout its first step records serve every later step (no second solve, and no
  // step placed by the arena's own rule after the first).
  if (with_state) {
    for (at::Tensor p : model->parameters()) {
      if (!p.grad().defined() && gradients.slot(p).defined()) p.mutable_grad() = gradients.slot(p);
    }
    trace_optimizer_step(config, *model, *arena, step, steps_fused_here(config));
    extras.graph.fixed_bytes += step.optimizer_state_bytes;
  }
  return CapturedStep{std::move(extras.graph), std::move(extras.block_starts), std::move(extras.signatures),
                      extras.sequence_hash};
}

std::string plan_first_step(const Config& config, const RunPlan& plan, const DataInfo& info, const Model& model,
                            MemoryManager& memory) {
  StaticPlanner* planner = memory.static_planner();
  if (planner == nullptr || !traceable_as_run(plan, model)) return "";
  const auto start = std::chrono::steady_clock::now();
  auto make = [&] {
    std::shared_ptr<Model> m = make_model(config, info, /*tensor_rank=*/0);
    if (plan.channels_last) m->use_channels_last();  // as the job lays it out
    return m;
  };
  CapturedStep step;
  try {
    const auto batch = [&] { return traced_batch(info, plan.batch.micro, /*meta=*/true); };
    // The gradients in the run's type (parallel.strategy = "auto" may have chosen bf16 ones).
    Config traced = config;
    traced.training.gradient_dtype = plan.gradient_dtype;
    step = trace_step_for_plan(traced, make, batch, state_in_device_memory(plan));
  } catch (const std::exception& e) {
    // The plan ahead is an optimization: a model the trace cannot run trains as before.
    return std::string("static plan: the trace on meta tensors failed (") + e.what() +
           "): the first step runs under DTR and is planned from its run";
  }
  if (step.signatures.empty()) return "";
  const bool planned = planner->plan_ahead(step);
  const double seconds = seconds_since(start);
  const StaticPlanStats& s = planner->stats();
  char line[320];
  if (planned) {
    std::snprintf(line, sizeof line,
                  "static plan: the first step planned from a trace on meta tensors (%zu ops; %s, %s; predicted "
                  "recomputation %.1f ms (modelled), peak %s) in %.1f s",
                  step.signatures.size(), s.last_solver.c_str(), s.last_status.c_str(), s.last_predicted_ms,
                  format_bytes(s.last_planned_peak).c_str(), seconds);
  } else {
    std::snprintf(line, sizeof line,
                  "static plan: no plan of the traced first step fits (%zu ops, %.1f s): the first step runs under "
                  "DTR and is planned from its run",
                  step.signatures.size(), seconds);
  }
  return line;
}

}  // namespace ht

#pragma once
// The first step of a static plan, planned rather than run under DTR: before training, one
// micro-batch of the job is traced on meta tensors (meta_trace.h), captured as static plans
// capture a step, and planned under the budget (StaticPlanner::plan_ahead). The first real step
// then matches the plan op by op and runs on it, so a budget whose first step DTR cannot train
// (fragmentation, one kernel's working set beside DTR's choices) may still train under a plan.
// The first planned step records the blocks the step layout packs (alloc/step_layout.h); from
// the second on, every block is placed at its planned offset.

#include "launcher/config/config.h"
#include "launcher/data/dataset.h"
#include "memory/static_plan.h"
#include "training/run_plan.h"

#include <functional>
#include <memory>
#include <string>
#include <utility>

namespace ht {

class MemoryManager;
class Model;

// One micro-batch of the model `make` builds (called on meta parameters), forward and backward
// on the (input, target) meta tensors `batch` makes (called where meta tensors take memory, so
// that the batch counts as the run's does), captured as static plans capture a step,
// under config's mixed precision. With `with_state`, config.training's optimizer steps once on
// the traced gradients and its state counts in the step's fixed bytes. The trainer's and the
// benchmarks' plan ahead (StaticPlanner::plan_ahead) is made from it.
CapturedStep trace_step_for_plan(const Config& config, const std::function<std::shared_ptr<Model>()>& make,
                                 const std::function<std::pair<at::Tensor, at::Tensor>()>& batch, bool with_state);

// Plans the job's step ahead when its memory manager makes static plans from the solver or
// the segments and the step can be traced as it will run (one rank's whole model: no pipeline
// stages, no tensor parallelism, parameters not sharded; a graph that is the same every step;
// memory.plan_first_step). Returns a line for the log, empty when nothing was tried.
std::string plan_first_step(const Config& config, const RunPlan& plan, const DataInfo& info, const Model& model,
                            MemoryManager& memory);

}  // namespace ht

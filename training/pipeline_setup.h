#pragma once
// The trainer's side of a pipeline (parallel/pipeline_stage.h runs the stage): the probe of the
// model's blocks, the layout made from the plan, the stage itself, and the whole model that a
// checkpoint sees.

#include "parallel/communicator.h"
#include "parallel/pipeline_stage.h"
#include "runtime/tensor_parallel.h"
#include "training/dataset.h"
#include "training/run_plan.h"

#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>

namespace ht {

// Runs training-mode forwards and backwards of `micro` through the model in fresh interpreters,
// on host memory (outside any budget), restoring what they changed (gradients, batch-norm
// statistics). parallel.stage_costs = "measured": each block's kernels timed, the median of three
// probes after a warm-up; "modeled": the modelled kernel costs (runtime/kernel_cost.h, backward
// twice the forward), the same on every rank and every run without any message.
struct ProbeGroups {
  TensorParallelGroup* tensor = nullptr;   // a tensor-parallel model's group
  TensorParallelGroup* context = nullptr;  // a context group (`micro` is then this rank's chunks)
};
BlockProfile profile_blocks(Model& model, const Batch& micro, const RunPlan& plan, const ProbeGroups& groups = {});
// Measured times differ between ranks: every rank takes rank 0's (collective over the replica
// groups, then the pipelines, then each tensor-parallel group from its first rank), so that all
// cut the model alike.
void share_block_costs(BlockProfile& profile, Communicator& replicas, Communicator& pipeline,
                       Communicator* tensor = nullptr);

// Partitions the blocks into plan.grid.pipeline x virtual_stages stages
// (parallel/pipeline_layout.h: lay_out_pipeline). UserError naming the key and what would work
// when the model cannot be cut so.
PipelineLayout make_pipeline_layout(const RunPlan& plan, const Model& model, BlockProfile profile);

// This rank's stage of the pipeline `plan` cuts `model` into, over `pipeline` (its ranks the
// stages): the blocks probed with the start of `data`'s training split (every rank alike; measured
// times are rank 0's everywhere), the layout made, and the stage keeping only its own share of
// the model. `replicas` and `tensor` (either null): the groups measured times are shared over;
// `context` (null without context parallelism): the probe's attention exchanges over it.
std::shared_ptr<PipelineStage> make_pipeline_stage(const RunPlan& plan, const DataSplits& data, Model& model,
                                                   Communicator* replicas, std::shared_ptr<Communicator> pipeline,
                                                   std::shared_ptr<Communicator> tensor,
                                                   std::shared_ptr<Communicator> context = nullptr);

// Runs `fn` with every parameter and buffer at its full size again (the others' as zeros, on
// host memory), then empties them again and drops their optimizer state: for a checkpoint's
// save or load, which see the whole model.
void with_full_model(PipelineStage& stage, Model& model, torch::optim::Optimizer& optimizer,
                     const std::function<void()>& fn);
// Before a checkpoint, inside with_full_model: rank 0 receives every parameter, buffer and
// optimizer state it does not train, so that it writes one model-wide layout (a single rank's).
void gather_to_first_stage(PipelineStage& stage, Model& model, torch::optim::Optimizer& optimizer);

}  // namespace ht

#pragma once
// The trainer's side of a pipeline (parallel/pipeline_stage.h runs the stage): the probe of the
// model's blocks, the layout made from the job's config, and the whole model that a checkpoint
// sees.

#include "launcher/config/config.h"
#include "launcher/data/dataset.h"
#include "parallel/communicator.h"
#include "parallel/pipeline_stage.h"
#include "runtime/tensor_parallel.h"

#include <torch/optim/optimizer.h>

#include <functional>

namespace ht {

// Runs training-mode forwards and backwards of `micro` through the model in fresh interpreters,
// on host memory (outside any budget), restoring what they changed (gradients, batch-norm
// statistics). parallel.stage_costs = "measured": each block's kernels timed, the median of three
// probes after a warm-up; "modeled": the modelled kernel costs (runtime/kernel_cost.h, backward
// twice the forward), the same on every rank and every run without any message.
BlockProfile profile_blocks(Model& model, const Batch& micro, const Config& config,
                            TensorParallelGroup* tensor = nullptr);
// Measured times differ between ranks: every rank takes rank 0's (collective over the replica
// groups, then the pipelines, then each tensor-parallel group from its first rank), so that all
// cut the model alike.
void share_block_costs(BlockProfile& profile, Communicator& replicas, Communicator& pipeline,
                       Communicator* tensor = nullptr);

// Partitions the blocks into config.parallel.pipeline_parallel x virtual_stages stages
// (parallel/pipeline_layout.h: lay_out_pipeline). UserError naming the key and what would work
// when the model cannot be cut so.
PipelineLayout make_pipeline_layout(const Config& config, const Model& model, BlockProfile profile);

// Runs `fn` with every parameter and buffer at its full size again (the others' as zeros, on
// host memory), then empties them again and drops their optimizer state: for a checkpoint's
// save or load, which see the whole model.
void with_full_model(PipelineStage& stage, Model& model, torch::optim::Optimizer& optimizer,
                     const std::function<void()>& fn);
// Before a checkpoint, inside with_full_model: rank 0 receives every parameter, buffer and
// optimizer state it does not train, so that it writes one model-wide layout (a single rank's).
void gather_to_first_stage(PipelineStage& stage, Model& model, torch::optim::Optimizer& optimizer);

}  // namespace ht

#pragma once
// The optimizer step's checks (StepAcrossStages, training/optimizer.h) where this rank holds only
// some of the model's gradients: the global norm that clipping divides by, and whether every
// rank's gradients are finite (fp16). Chosen once with the layout (training/trainer_parts.h); a
// rank that holds all of them needs none (the norm of its own gradients).

#include "parallel/communicator.h"
#include "parallel/pipeline_stage.h"
#include "training/optimizer.h"
#include "training/optimizer_shard.h"

#include <vector>

namespace ht {

// Pipeline stages: each parameter's norm gathered from the stage that trains it, in model order,
// combined as one rank combines them (bit for bit one rank's norm); finite if every stage's is.
StepAcrossStages pipeline_checks(PipelineStage& stage);

// Sharded gradients (ZeRO-2, ZeRO-3): each rank holds its pieces' share of them; the norm sums
// the ranks' sums of squares, and a step is finite if every rank's pieces are.
// The norms are summed on `device` (the gradients'), in the collectives there: on a GPU with NCCL
// the host does not wait for them.
StepAcrossStages shard_checks(const OptimizerShard& shard, Communicator& replicas, at::Device device);

// Tensor parallelism: each rank holds its parts of the split parameters (`split`: which of the
// model's, by model order) and the whole of the replicated ones, whose gradients are equal on
// every rank of the group. The norm counts every rank's parts and one copy of the rest: over this
// rank's pieces where `shard` is set (sharded gradients), else over `params` (a stage's own,
// without the tied copies `stage` holds); summed over the replicas (sharded), the group and the
// stages. Finite if every rank's are.
StepAcrossStages tensor_checks(Communicator& group, const std::vector<at::Tensor>& model_params,
                               const std::vector<bool>& split, const std::vector<at::Tensor>& params,
                               const OptimizerShard* shard, Communicator* replicas, PipelineStage* stage,
                               at::Device device);

}  // namespace ht

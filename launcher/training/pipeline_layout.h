#pragma once
// Where a pipeline puts the model: which blocks each virtual stage runs, the shape of each
// activation crossing a stage boundary, the random seeds each block draws, and which parameters
// each rank trains. Every rank computes it alike from the model and the config (every rank builds
// the whole model from the same seed), so nothing of it is exchanged and no message carries a
// shape.

#include "launcher/config/config.h"
#include "launcher/data/dataset.h"
#include "models/model.h"
#include "parallel/communicator.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/stage_partition.h"

#include <optional>
#include <string>
#include <vector>

namespace ht {

// One forward of one micro-batch through every block, as the probe saw it.
struct BlockProfile {
  std::vector<std::vector<int64_t>> out_sizes;  // per block: its output's shape (dim 0: the batch)
  std::vector<at::ScalarType> out_dtype;        // per block
  std::vector<uint64_t> seeds;                  // per block: seeds it draws per forward (dropout)
  std::vector<BlockCost> costs;                 // per block: modelled time, activation and state bytes
  int64_t micro_batch = 0;                      // the probe's batch size
};

// Runs training-mode forwards and backwards of `micro` through the model in fresh interpreters,
// on host memory (outside any budget), restoring what they changed (gradients, batch-norm
// statistics). parallel.stage_costs = "measured": each block's kernels timed, the median of three
// probes after a warm-up; "modeled": the modelled kernel costs (runtime/kernel_cost.h, backward
// twice the forward), the same on every rank and every run without any message.
BlockProfile profile_blocks(Model& model, const Batch& micro, const Config& config);
// Measured times differ between ranks: every rank takes rank 0's (collective over the replica
// groups, then the pipelines), so that all cut the model alike.
void share_block_costs(BlockProfile& profile, Communicator& replicas, Communicator& pipeline);

struct PipelineLayout {
  ScheduleKind kind = ScheduleKind::k1f1b;
  ScheduleShape shape;
  std::vector<int> first_block;  // per virtual stage, and one past the last block at the end
  Partition partition;           // per virtual stage: predicted time and memory
  BlockProfile profile;
  std::string costs = "measured";  // what balanced the stages: parallel.stage_costs, or "stage_blocks"

  int virtual_stages() const { return shape.stages * shape.virtual_stages; }
  int blocks_begin(int vs) const { return first_block[static_cast<size_t>(vs)]; }
  int blocks_end(int vs) const { return first_block[static_cast<size_t>(vs) + 1]; }
  // The activation entering virtual stage vs > 0 for a batch of n.
  std::vector<int64_t> input_sizes(int vs, int64_t n) const;
  at::ScalarType input_dtype(int vs) const;
  // Seeds drawn before block b's first in one micro-batch's forward.
  uint64_t seeds_before(int block) const;
  uint64_t seeds_per_micro_batch() const { return seeds_before(static_cast<int>(profile.seeds.size())); }
};

// Partitions the blocks into config.parallel.pipeline_parallel x virtual_stages stages:
// parallel.stage_blocks when given, else balanced by modelled time within the memory each stage
// holds (state, plus activations times the micro-batches its schedule keeps in flight).
// UserError naming the key and what would work when the model cannot be cut so.
PipelineLayout make_pipeline_layout(const Config& config, const Model& model, BlockProfile profile);

// The stage table printed at start, with the split by parameter count beside it.
std::string describe_pipeline(const PipelineLayout& layout);

// Which rank registers each parameter of the model, in model.parameters() order: the rank
// holding the block that registers it. A tied weight belongs to the first block's rank.
std::vector<int> parameter_owners(const Model& model, const PipelineLayout& layout);
// Likewise for model.buffers().
std::vector<int> buffer_owners(const Model& model, const PipelineLayout& layout);

// The parameters `rank` trains, in model order: those of its blocks, and the tied weights its
// blocks use (a copy of another stage's parameter).
std::vector<at::Tensor> stage_parameters(const Model& model, const PipelineLayout& layout, int rank);

// A tied weight used on two ranks: its gradients are summed across them before the step.
struct TiedParameter {
  at::Tensor param;
  int owner = 0, user = 0;  // ranks: the one registering it, the one using a copy
};
std::vector<TiedParameter> tied_parameters(const Model& model, const PipelineLayout& layout);

}  // namespace ht

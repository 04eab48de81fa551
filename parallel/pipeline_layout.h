#pragma once
// Where a pipeline puts the model: which blocks each virtual stage runs, the shape of each
// activation crossing a stage boundary, the random seeds each block draws, and which parameters
// each rank trains. Every rank computes it alike from the model and the config (every rank builds
// the whole model from the same seed), so nothing of it is exchanged and no message carries a
// shape. training/pipeline_setup.h makes it from the job's config.

#include "models/model.h"
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

struct PipelineLayout {
  ScheduleKind kind = ScheduleKind::k1f1b;
  ScheduleShape shape;
  std::vector<int> first_block;  // per virtual stage, and one past the last block at the end
  Partition partition;           // per virtual stage: predicted time and memory
  BlockProfile profile;
  StageCosts costs = StageCosts::kMeasured;  // what the blocks' times are
  bool counts_given = false;                 // the stages' blocks were given (parallel.stage_blocks), not balanced
  // 4-D activations and their gradients cross stages channels-last (training.channels_last), as
  // the stages' kernels make and read them: neither side copies them into another layout.
  bool channels_last = false;

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

// How each virtual stage's blocks are chosen.
struct PipelineRequest {
  ScheduleKind kind = ScheduleKind::k1f1b;
  ScheduleShape shape;
  std::vector<int> stage_blocks;   // blocks per virtual stage; empty: balanced by the blocks' times
  int64_t memory_limit_bytes = 0;  // what a stage may hold (state, and activations times the
                                   // micro-batches its schedule keeps in flight); 0: no limit
  StageCosts costs = StageCosts::kMeasured;  // what profile's times are
};

// Partitions the model's blocks into request.shape's virtual stages: request.stage_blocks when
// given, else balanced by time within the memory limit. std::invalid_argument saying why when the
// model cannot be cut so.
PipelineLayout lay_out_pipeline(const PipelineRequest& request, const Model& model, BlockProfile profile);

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

#pragma once
// Cutting a model (a sequence of blocks: embedding, layers, head) into contiguous pipeline stages,
// one per rank, by each block's profiled cost. Frameworks split by layer or parameter count,
// which leaves the stages with the embedding and the head slower and heavier (their parameters
// say little about their time, and the first stage holds the most micro-batches in flight);
// balancing the measured milliseconds under a per-stage memory limit avoids that.
// Plain data and pure functions: no tensors, no communicator.

#include "base/choice.h"

#include <cstdint>
#include <string>
#include <vector>

namespace ht {

// What the block times that balance the stages are (parallel.stage_costs): measured on this run
// (rank 0's probe), or modelled from the ops' shapes (runtime/kernel_cost.h).
enum class StageCosts : uint8_t { kMeasured, kModeled };
template <>
struct ChoiceNames<StageCosts> {
  static constexpr std::pair<StageCosts, const char*> table[] = {{StageCosts::kMeasured, "measured"},
                                                                 {StageCosts::kModeled, "modeled"}};
};

// One block's profiled cost (one measured step, or the planner's profile).
struct BlockCost {
  std::string name;
  double forward_ms = 0, backward_ms = 0;  // per micro-batch
  int64_t activation_bytes = 0;  // held per micro-batch in flight (from its forward until its backward)
  int64_t state_bytes = 0;       // parameters + gradients + optimizer state: held always
  int64_t parameters = 0;        // element count (for the parameter-count baseline and the table)
};

// One stage of a partition.
struct StagePlan {
  int first_block = 0, blocks = 0;  // [first_block, first_block + blocks)
  double ms = 0;                    // forward + backward per micro-batch
  int64_t peak_bytes = 0;           // state + activation_bytes * in_flight
  int64_t parameters = 0;
};

struct Partition {
  std::vector<StagePlan> stages;
  double slowest_ms = 0;  // the pipeline runs at the pace of its slowest stage
  double mean_ms = 0;     // slowest / mean is the imbalance (1: perfect)
};

struct PartitionOptions {
  int stages = 1;
  // Micro-batches whose activations a stage holds at once (1F1B: stages - s on stage s; GPipe: all m).
  // Empty: 1 per stage. Otherwise one count >= 1 per stage.
  std::vector<int> in_flight;
  int64_t memory_limit_bytes = 0;  // per stage; 0: unlimited
};

// The in-flight counts a schedule implies, for PartitionOptions::in_flight: 1F1B keeps
// `stages - s` micro-batches alive on stage s (capped by the micro-batches of a step), GPipe all of
// them on every stage. Here so that callers and tests do not each re-derive them.
std::vector<int> one_f_one_b_in_flight(int stages, int micro_batches);
std::vector<int> gpipe_in_flight(int stages, int micro_batches);

// The exact optimum: contiguous stages of >= 1 block each, minimizing the slowest stage's ms with
// every stage's peak_bytes <= memory_limit_bytes (when set); among those, the smallest largest
// peak; among those, the earliest cuts (so the result is deterministic). O(stages * n^2).
// Throws std::invalid_argument, saying what would work, when stages < 1, stages > blocks, a cost
// is negative, in_flight is malformed, or no partition fits the memory limit (then the message
// gives the smallest per-stage limit that fits and whether more stages would).
Partition balance_stages(const std::vector<BlockCost>& blocks, const PartitionOptions& options);

// The same optimum where a block's cost depends on the stage that runs it (`at_stage[s]`: every
// block as stage s would run it; AdaPipe's per-stage recomputation makes the first stages'
// blocks slower and lighter). One list per stage, each covering every block. O(stages * n^2).
Partition balance_stages(const std::vector<std::vector<BlockCost>>& at_stage, const PartitionOptions& options);

// The baseline the frameworks use: contiguous stages minimizing the largest stage parameter count
// (earliest cuts on ties), with its ms and peaks computed from the same costs so that the two can
// be compared. Ignores the memory limit, as they do: the peaks show whether it would fit.
Partition partition_by_parameters(const std::vector<BlockCost>& blocks, const PartitionOptions& options);

// The user's override (parallel.stage_blocks = [..]): exactly `blocks_per_stage` blocks per stage.
// Throws std::invalid_argument naming what is wrong (not one count per stage, a count < 1, a sum
// other than the number of blocks). Does not check the memory limit (the user asked for this
// split); the returned peaks let a caller warn.
Partition partition_from_counts(const std::vector<BlockCost>& blocks, const std::vector<int>& blocks_per_stage,
                                const PartitionOptions& options);

// Blocks per stage of a partition: what parallel.stage_blocks takes to reproduce it.
std::vector<int> stage_block_counts(const Partition& partition);

// The smallest per-stage memory limit for which some partition into options.stages stages fits
// (options.memory_limit_bytes is ignored): what an impossible limit should be raised to.
int64_t smallest_stage_limit_bytes(const std::vector<BlockCost>& blocks, const PartitionOptions& options);

// A fixed-width table printed at start: one row per stage (blocks first..last and count,
// parameters, predicted ms per micro-batch, predicted peak MiB), then the slowest/mean ratio.
std::string format_stage_table(const std::vector<BlockCost>& blocks, const Partition& partition);

}  // namespace ht

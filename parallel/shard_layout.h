#pragma once
// How sharded data parallelism (parallel.shard) splits a model's state among the ranks of one
// data-parallel group. Plain data: no tensors, tested on its own, and what the planner counts
// bytes with.
//
// The unit is DataParallel's bucket (parallel/data_parallel.h): its parameters lie one after
// another in a flat span (the gradient block, and under sharding the parameter block too), and
// each rank owns one contiguous range of that span, as even as possible: with n elements and N
// ranks the first n mod N ranks own one element more. A rank's range cuts parameters where it
// cuts them; the piece of each parameter inside it is what the rank's optimizer keeps state for
// and updates. Per bucket, not over the whole model, so that a bucket's reduce-scatter and
// all-gather can run as soon as that bucket is ready, as its all-reduce does today. Nothing is
// padded: MPI's collectives take uneven counts, and NCCL's padding stays inside its communicator.

#include "base/choice.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ht {

// parallel.shard: what the ranks of a data-parallel group split among them, ZeRO's stages:
// the optimizer state (stage 1), and the gradients (stage 2), and the parameters (stage 3).
enum class ShardLevel : uint8_t { kNone, kOptimizer, kGradients, kParameters };
template <>
struct ChoiceNames<ShardLevel> {
  static constexpr std::pair<ShardLevel, const char*> table[] = {{ShardLevel::kNone, "none"},
                                                                 {ShardLevel::kOptimizer, "optimizer"},
                                                                 {ShardLevel::kGradients, "gradients"},
                                                                 {ShardLevel::kParameters, "parameters"}};
};

// Whether ZeRO-1 and ZeRO-2 shard the fp32 master weights with the optimizer (Megatron's
// distributed optimizer; parallel/parameter_shards.h, set_resident): where 16-bit copies are kept,
// over several replicas of one stage, without a budget that evicts (whose drops of gathered
// copies every rank would have to decide alike: ZeRO-3's rules). The trainer's parts and the
// planner both ask this (training/trainer_parts.h, planner/weight_copy_terms.h).
inline bool shards_masters(ShardLevel level, int64_t replicas, int64_t stages, bool evicting_budget,
                           bool keeps_copies) {
  return (level == ShardLevel::kOptimizer || level == ShardLevel::kGradients) && replicas > 1 && stages == 1 &&
         !evicting_budget && keeps_copies;
}

// n elements among `ranks`, as even as possible (the first n mod ranks get one more).
std::vector<int64_t> even_counts(int64_t n, int ranks);

// The part of one parameter inside one rank's range.
struct ShardPiece {
  size_t member = 0;   // index into the bucket's members
  int64_t offset = 0;  // elements into the parameter, in its memory order
  int64_t length = 0;
  int64_t at = 0;      // elements into the bucket's span
};

struct BucketShards {
  int64_t elements = 0;                         // the bucket's span
  std::vector<int64_t> counts;                  // each rank's range, in rank order
  std::vector<int64_t> begins;                  // where each rank's range starts in the span
  std::vector<std::vector<ShardPiece>> pieces;  // each rank's pieces, in span order
};

// The shards of a bucket whose members have `member_elements` elements each, in span order.
BucketShards shard_bucket(const std::vector<int64_t>& member_elements, int ranks);

}  // namespace ht

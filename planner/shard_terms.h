#pragma once
// Sharded data parallelism (parallel.shard; training/optimizer_shard.h) in a prediction.
// Plain functions of shapes and layout, so that a planner for clusters reuses them:
// - memory: at "optimizer" (ZeRO-1) a rank keeps the optimizer state of its share of each bucket,
//   the shares as parallel/shard_layout.h splits them; the parameters and the gradient block stay
//   whole. Under a budget the state lies in one block per dtype (compact_optimizer_state), so its
//   bytes are the arena's rounding of the share's elements times the state's bytes per element
//   (8 for AdamW, 4 for SGD with momentum, 0 without). The optimizer step's temporaries shrink
//   with the largest piece a rank steps (measured whole with the largest parameter). At
//   "gradients" (ZeRO-2) the gradient block gives way to the rank's share of each bucket (one
//   tensor a bucket) and the block of the largest bucket, taken as resident (a bucket's block
//   lives from its first gradient to its reduce-scatter). The rank with the highest peak is the
//   prediction;
// - time: after the step, each bucket's updated parameters are all-gathered (a ring: ranks - 1
//   steps of bytes / ranks each), not hidden under anything. At "gradients" the all-reduce
//   becomes a reduce-scatter per micro-batch (the same ring's cost), on the thread running
//   backward: exposed.
// - at "parameters" (ZeRO-3) the buckets are cut where blocks end (profile.block_buckets); the
//   bucketed parameters give way to the rank's fp32 shards and, while forward and backward run,
//   the buckets gathered at once (gathered_parameter_bytes: backward gathers again only the
//   buckets whose weights it reads, which the profile records; under autocast a block whose
//   weights are all cast reads only the copies forward kept), and the one
//   all-gather after the step becomes, every micro-batch, one per bucket in forward and one per
//   bucket backward reads again (parameter_gather_ms); with prefetch (parallel.prefetch, not
//   under a budget with eviction) the next block's gathered bytes join the held ones and its
//   gather's time hides under the current block's compute where it is shorter. The bf16
//   copies of gathered weights that forward keeps for backward are activations, measured as such.
// - with pipeline stages (ZeRO-1 only): the terms above are the replica group's share of the
//   whole model's; planner/pipeline_terms.h then takes the fullest stage's share of them, and the
//   after-step all-gather carries that stage's parameters only (Prediction::stage_state_share).
// The ZeRO paper's formulas (2P + 2P + 12P/N for fp16 parameters with fp32 master weights and
// Adam at the first stage) are a check in the tests and docs: this project keeps fp32 parameters
// and fp32 gradients, so its terms are 4P + 4P + 8P/N with AdamW.

#include "planner/plan.h"
#include "planner/profile_at.h"
#include "planner/machine.h"
#include "planner/profile.h"
#include "planner/step_trace.h"

#include <cstdint>
#include <functional>
#include <vector>

namespace ht {

// The buckets `level` shards: the profile's, or at "gradients" and "parameters" those cut at blocks
// (the trainer cuts them there: training/trainer.cpp, bucket_units).
const std::vector<std::vector<int64_t>>& sharded_buckets(const ModelProfile& profile, ShardLevel level);
// Bytes of sharded parameters gathered at once at most while forward and backward run (elements
// of `element_bytes`): a block's buckets and those of the `prefetch` blocks after it in forward,
// or, in backward, a block's buckets that backward reads again (`backward_reads`, indices into
// profile.block_buckets; null: all) and those of the `prefetch` blocks before it, with the
// buckets several blocks read (tied weights) held throughout.
// `copies`: 16-bit gathers (parallel/parameter_shards.h, keep_copies), by that profile point's
// reads: a bucket holding a cast weight gathers its 16-bit copies (2 bytes an element), and its
// weights read in fp32 alone (ProfilePoint::fp32_read_elements); backward gathers again the copies
// and the fp32 weights the tape saved (backward_copy_buckets, backward_fp32_buckets), not
// `backward_reads`.
int64_t gathered_parameter_bytes(const ModelProfile& profile, int64_t element_bytes,
                                 const std::vector<size_t>* backward_reads, int prefetch = 0,
                                 const ProfilePoint* copies = nullptr);
// What the gathered buckets add to the peak of forward and backward, walking `trace` (the
// unsharded step at the plan's micro-batch): each kernel's bytes in use plus what its block holds
// gathered (forward: its buckets and the next `prefetch` blocks'; backward: as
// gathered_parameter_bytes; the loss: what forward ended with), against the trace's own peak.
// Early in forward few activations are kept: a block and the blocks prefetched with it may set
// the peak there, or add nothing. Without events, gathered_parameter_bytes.
// `gradient_element_bytes` > 0: the sharded gradients' blocks join, placed as ZeRO-2's walk
// places them (planner/gradient_blocks.h, gradient_block_steps: each bucket's from its first
// gradient to its reduce-scatter, or overlapped to the next one's, with `part_bytes` from the
// second micro-batch on, to backward's end), and are in the result; without events, the largest
// bucket's block. `fold`: the trace's fold (planner/gradient_blocks.h; null: folded here).
int64_t gathered_parameter_peak_bytes(const ModelProfile& profile, const StepTrace& trace, int64_t element_bytes,
                                      const std::vector<size_t>* backward_reads, int prefetch,
                                      int64_t gradient_element_bytes = 0, bool overlapped = false,
                                      const std::vector<int64_t>& part_bytes = {}, const StepFold* fold = nullptr,
                                      const ProfilePoint* copies = nullptr);
// Whether the trainer runs `plan`'s reduce-scatters beside backward (GradientShards::set_overlap):
// at "gradients" with parallel.overlap, at "parameters" where its gathers are prefetched.
bool reduce_scatters_overlap(const Plan& plan);
// Sharded masters (planner/weight_copy_terms.h, shards_masters): the weights read in fp32, as the
// profile at the plan's precision saw them, each bucket's (each gathered in fp32 as a collective of
// its own), and how many of them lie in buckets whose 16-bit copies are gathered too (their slots
// there are gathered with the copies).
struct ReadsInFp32 {
  std::vector<int64_t> elements;  // per bucket holding any
  int64_t in_copies = 0;
};
ReadsInFp32 reads_in_fp32(const ModelProfile& profile, const Plan& plan);
// What sharded masters hold gathered beside the 16-bit copies: the weights read in fp32, whole, and
// their slots in the 16-bit buckets.
int64_t masters_gathered_bytes(const ModelProfile& profile, const Plan& plan);
// The blocks gathered ahead in `plan` (parallel.prefetch; none under a budget with eviction,
// where the memory manager decides what stays gathered, nor below "parameters").
int prefetch_depth(const Plan& plan);
// One micro-batch's all-gathers of sharded parameters: in all, and what forward and backward wait
// for (with plan.prefetch, a block's gather runs while the block before it computes, each block's
// compute its share of `micro_batch_ms` by the profile's block times; as one block ahead even
// when more are).
struct GatherTimes {
  double total_ms = 0, exposed_ms = 0;
};
GatherTimes parameter_gather_ms(const ModelProfile& profile, const Machine& machine, const Plan& plan,
                                double micro_batch_ms);
// Elements of the model rank 0 (the fullest) of `ranks` updates: its share of each bucket.
int64_t shard_elements(const std::vector<std::vector<int64_t>>& buckets, int ranks);
// The optimizer state's bytes per parameter element in `profile` (measured whole: 8, 4 or 0).
int64_t state_bytes_per_element(const ModelProfile& profile);
// Ring all-gather of `bytes` in all over `ranks` (alpha-beta): ranks - 1 steps of bytes / ranks.
// `stride`: the ranks between two members of the group (a replica group's are a tensor-parallel
// group apart: parallel/process_grid.h), which decides whether the ring leaves the node and
// through how many NICs of each node (planner/machine.h, ring_link).
double allgather_ms(const Machine& machine, int ranks, int64_t bytes, int stride = 1);

// The share of the optimizer step's measured time a sharded rank spends: the share of the
// elements it steps (the fullest rank's); 1 unsharded.
double shard_step_share(const ModelProfile& profile, const Plan& plan);
// Fills what plan.shard changes in `p`: the optimizer state's bytes per rank (and the peak with
// them), and the all-gather after the step (p.gather_ms, counted in p.step_ms by the caller).
// `step`: makes the step at the plan's micro-batch (trace_for), along which gathered parameters
// (ZeRO-3) and the gradients' blocks (ZeRO-2) are placed, each walk once per profile and what it
// depends on; null: at the activations' peak (gathered_parameter_bytes).
// `gradient_blocks` >= 0: at "gradients", gradient_blocks_term's figure (planner/gradient_blocks.h), given.
void shard_memory_terms(const ModelProfile& profile, const Plan& plan, Prediction& p,
                        const TraceMaker* step = nullptr, int64_t gradient_blocks = -1);
void shard_time_terms(const ModelProfile& profile, const Machine& machine, const Plan& plan, Prediction& p);
// The recorded step up to its last kernel: what the optimizer allocates after backward (sized by
// the whole parameters) left out, for a replay whose optimizer steps pieces.
StepTrace without_optimizer_phase(const StepTrace& trace);

}  // namespace ht

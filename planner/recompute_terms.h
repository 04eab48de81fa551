#pragma once
// Full recomputation (memory.policy = "full", Megatron's) as the cost model predicts it for a
// cluster's device: one micro-batch of the whole model replayed with its blocks dropped as the
// engine drops them (planner/dtr_replay.h, ReplayOptions::checkpoint_blocks), without the model's
// state, which the plan's terms add. What forward leaves (the blocks' outputs) is held per
// micro-batch in flight, of a pipeline stage's blocks; what a block's backward adds while it
// regenerates is held once; the regenerations run inside each micro-batch's backward. (On the
// machine at hand, where budgets are tight, the whole step is replayed in the arena instead, as
// any eviction policy's: planner/cost_model.cpp.)

#include "planner/plan.h"
#include "planner/profile_at.h"

#include <utility>
#include <vector>

namespace ht {

// The replay at the plan's micro-batch and precision in its budget: exact at the two smallest
// profiled sizes (replayed once each and kept on the profile), on the line through them elsewhere.
// With plan.block_offload, its blocks may offload over `link` (memory_terms.h, block_link_of).
BlockRecomputeReplay block_recompute_terms(const ModelProfile& profile, const Plan& plan,
                                           const schedule::BlockLink& link = {});

// The link per_block's blocks offload over: block_link_of's over the model's blocks where the
// plan offloads (memory.block_offload), else off.
schedule::BlockLink block_link(const ModelProfile& profile, const Machine& machine, const Plan& plan);

// The replays block_recompute_terms reads for `plans` (those predict replays blocks for,
// replays_blocks), each distinct one once, on up to `threads` threads, kept on the profiles. A
// search's plans share a few dozen, which its threads, predicting neighbouring plans, replayed
// side by side: the 70B search on 64 devices ran 54 replays of 27, a tenth of a second each.
void replay_blocks_ahead(const std::vector<std::pair<const ModelProfile*, Plan>>& plans, int threads);

// Replaces p's activation, peak, recomputation and eviction terms by the replay's (with stages,
// through pipeline_terms with the regenerations in each micro-batch's time); `fb_ms`: one
// micro-batch's forward and backward on one rank, `slowdown` as predict's.
void block_recompute_step_terms(const ModelProfile& profile, const Machine& machine, const Plan& plan,
                                const BlockRecomputeReplay& blocks, double fb_ms, double slowdown, Prediction& p);

}  // namespace ht

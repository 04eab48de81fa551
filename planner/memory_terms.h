#pragma once
// A plan's memory per rank (docs/planner.md, "How it predicts"): the state (parameters, gradients,
// optimizer state, the batch) and the activations, exact from the profile and sharded as the plan
// shards them (planner/shard_terms.h); without a gradient block, the gradients as backward makes
// them (planner/gradient_blocks.h); and under the memory policy: full recomputation's replayed
// blocks, a budget's eviction (the DTR replay, or a static plan) and host swap.

#include "planner/plan.h"
#include "planner/profile_at.h"
#include "planner/recompute_terms.h"

namespace ht {

// memory.block_offload's link as the engine's block_link weighs it (memory/memory_manager.cpp):
// the host link's time per byte, and the host budget (half the host's memory where none is set)
// shared by the `blocks` but the last.
schedule::BlockLink block_link_of(const Machine& machine, const Plan& plan, int blocks);
// The state and activations' terms of p, and its peak without a policy that evicts.
void state_memory_terms(const ModelProfile& profile, const Plan& plan, Prediction& p);
// The memory policy's terms of p: `blocks`, full recomputation's replay where the plan replays
// blocks (null otherwise); `slowdown`, the rank's compute speed against the profile's.
void policy_terms(const ModelProfile& profile, const Machine& machine, const Plan& plan, double slowdown,
                  const BlockRecomputeReplay* blocks, Prediction& p);

}  // namespace ht

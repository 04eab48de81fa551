#pragma once
// The cost model: a plan's peak memory per rank and its step time, one term per mechanism, from
// a ModelProfile and a Machine. Each term is a small function of plain data, so a new mechanism
// (pipeline stages: bubble and in-flight micro-batches; static plans; host swap: link time and
// its hidden share) adds its own term and its own options without rewriting the others.

#include "planner/machine.h"
#include "planner/plan.h"
#include "planner/profile.h"
#include "planner/profile_at.h"

#include <cstdint>
#include <string>

namespace ht {

// `profile` is of one rank of the plan's tensor-parallel group (profile.tensor_parallel ==
// plan.tensor; std::invalid_argument otherwise).
Prediction predict(const ModelProfile& profile, const Machine& machine, const Plan& plan);
// Whether predict prices `plan`'s full recomputation by the blocks' replay (a cluster's device,
// or stages: planner/recompute_terms.h), not by replaying the whole step in its arena.
bool replays_blocks(const Machine& machine, const Plan& plan);

}  // namespace ht

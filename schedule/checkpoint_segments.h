#pragma once
// The schedule torch's checkpoint_sequential runs, the PyTorch user's baseline (memory.policy =
// "segments"): the model's blocks cut into ceil(sqrt(n)) segments, every segment but the last
// dropping what it computes and recomputing it all just before the backward of its last op; what
// crosses a segment's end is kept. Plain data, so that the runtime runs it and the planner
// predicts it from the same function.

#include "schedule/schedule.h"

#include <vector>

namespace ht::schedule {

// `block_starts`: the forward op index at which each block began.
Schedule checkpoint_segments(const StepGraph& graph, const std::vector<int>& block_starts);

}  // namespace ht::schedule

#pragma once
// Sharded gradients' blocks placed along a traced step (issue 31's ZeRO-2 and ZeRO-3, issue 33's
// seventh part): a bucket's block (its buckets cut at blocks, as the trainer cuts a sharded
// level's) exists from the accumulation of its first gradient to its reduce-scatter, or, with the
// reduce-scatters overlapped (GradientShards::set_overlap), to the next bucket's start, and the
// step's peak with them is where the walk finds it, not the largest block beside the activations'.

#include "planner/cost_model.h"

#include <functional>
#include <vector>

namespace ht {

// One past the last kernel's end: forward and backward (what follows is the optimizer's phase).
size_t forward_backward_end(const StepTrace& trace);

// The change in gradient blocks' bytes at each event of [0, end] (ZeRO-3's walk,
// gathered_parameter_peak_bytes): each bucket's block from the event after its first gradient's
// kernel ends until its reduce-scatter starts (the next kernel after its last gradient and every
// earlier bucket's), or with `overlapped` until the next bucket's does.
std::vector<int64_t> gradient_block_deltas(const ModelProfile& profile, const StepTrace& trace, size_t end,
                                           int64_t element_bytes, bool overlapped);

// "gradients" (ZeRO-2) along `trace`: the most the step's tensors and the buckets' gradient blocks
// (cut at blocks, as the trainer cuts a sharded level's; each from its first gradient to its
// reduce-scatter, or with `overlapped` to the next bucket's, as gathered_parameter_peak_bytes
// places them) hold together in forward and backward, above the trace's own peak; overlapped,
// each bucket's `part_bytes` too, from its reduce-scatter's start to the next one's (a micro-batch
// after the first one's). -1 without the profile's block buckets or the trace's events.
int64_t gradient_blocks_above_peak(const ModelProfile& profile, const StepTrace& trace, int64_t element_bytes,
                                   bool overlapped, const std::vector<int64_t>& part_bytes = {});
// At "gradients", `plan`'s gradient blocks (and overlapped reduce-scatters' parts) above the
// activations' peak along `trace`, the step at its micro-batch (gradient_blocks_above_peak); -1
// where it cannot say. The second form traces `step()` only the first time a profile is asked
// for the plan's micro-batch, precision, overlap and (with accumulation) ranks, and keeps it.
int64_t gradient_blocks_term(const ModelProfile& profile, const Plan& plan, const StepTrace& trace);
int64_t gradient_blocks_term(const ModelProfile& profile, const Plan& plan, const std::function<StepTrace()>& step);

}  // namespace ht

#pragma once
// Sharded gradients' blocks placed along a traced step (issue 31's ZeRO-2 and ZeRO-3, issue 33's
// seventh part): a bucket's block (its buckets cut at blocks, as the trainer cuts a sharded
// level's) exists from the accumulation of its first gradient to its reduce-scatter, or, with the
// reduce-scatters overlapped (GradientShards::set_overlap), to the next bucket's start, and the
// step's peak with them is where the walk finds it, not the largest block beside the activations'.

#include "planner/plan.h"
#include "planner/profile_at.h"

#include <functional>
#include <vector>

namespace ht {

// One past the last kernel's end: forward and backward (what follows is the optimizer's phase).
size_t forward_backward_end(const StepTrace& trace);

// Sharded gradients' blocks along [0, end] (end: forward_backward_end), the walk ZeRO-2's and
// ZeRO-3's peaks share, placed where the tape does it (runtime/tape.cpp): at event i, `made[i]`
// bytes come before the event counts (a bucket's block where the tape copies its first gradient
// in: after the kernel ends and the gradient it was given is freed, before what it made is), then
// the event, then `started[i]` (the reduce-scatters starting there: each once the tape has freed
// the gradients that complete its bucket and every earlier one, or overlapped where the next one
// starts: its block goes, and from the second micro-batch on a part of its shard's size,
// `part_bytes`, lives from its start to the next one's). Index `end` is backward's end: the last
// kernel's gradients accumulated, the trace's trailing frees (trailing_frees) done.
// Bytes that join (or leave, negative) at a few of a trace's events: a bucket's block or part, a
// handful per bucket against a 70B step's millions of events, kept sparse.
class EventDeltas {
 public:
  void add(size_t event, int64_t bytes) { deltas_.emplace_back(event, bytes); }
  // In event order (deltas at one event keep the order they were added in).
  void sort();
  // The sum at `event`, for events asked in increasing order (a walk along the trace).
  int64_t take(size_t event) {
    int64_t sum = 0;
    while (next_ < deltas_.size() && deltas_[next_].first == event) sum += deltas_[next_++].second;
    return sum;
  }

 private:
  std::vector<std::pair<size_t, int64_t>> deltas_;
  size_t next_ = 0;
};
struct GradientBlockSteps {
  size_t end = 0;
  EventDeltas made, started;
};
GradientBlockSteps gradient_block_steps(const ModelProfile& profile, const StepTrace& trace, int64_t element_bytes,
                                        bool overlapped, const std::vector<int64_t>& part_bytes = {});
// The bytes the trace frees right after its last kernel (that kernel's inputs), before the
// optimizer's phase.
int64_t trailing_frees(const StepTrace& trace, size_t end);
// The reduce-scatters' parts of `plan` (gradient_block_steps' part_bytes): the fullest rank's
// shard of each bucket where micro-batches accumulate; none otherwise.
std::vector<int64_t> reduce_scatter_parts(const ModelProfile& profile, const Plan& plan);

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
int64_t gradient_blocks_term(const ModelProfile& profile, const Plan& plan, const TraceMaker& step);

// Without a gradient block (no arena and one replica, training/trainer.cpp) a parameter's
// gradient is the tensor its kernel made, moved into .grad() where the block would take a copy
// (runtime/tape.cpp), and kept until the optimizer's step. Along `trace` (recorded with the block):
// the most forward and backward hold with each kernel's gradients kept where the tape frees them
// after copying, above the trace's own peak: what a micro-batch's gradients add to its activations'
// peak before all of them exist (at most the gradient bytes; a tied weight's second gradient, which
// the tape adds into the first and frees, is counted as kept). -1 without the trace's events.
int64_t kept_gradients_above_peak(const StepTrace& trace);
// Whether `plan`'s run keeps its gradients as backward makes them, with one micro-batch a step:
// its forward and backward then peak with only the gradients made so far (kept_gradients_above_peak).
bool keeps_gradients_as_made(const Plan& plan);
// kept_gradients_above_peak of `step()`, traced only the first time a profile is asked for the
// plan's micro-batch and precision.
int64_t kept_gradients_term(const ModelProfile& profile, const Plan& plan, const TraceMaker& step);
// With keeps_gradients_as_made(plan): p's peak the larger of forward and backward's (the state
// without gradients, the activations and the gradients made by their peak) and the optimizer's
// (every gradient), the plan's step traced once (kept_gradients_term).
void kept_gradient_terms(const ModelProfile& profile, const Plan& plan, Prediction& p);

}  // namespace ht

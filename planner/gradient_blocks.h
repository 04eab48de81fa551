#pragma once
// Sharded gradients' blocks placed along a traced step (issue 31's ZeRO-2 and ZeRO-3, issue 33's
// seventh part): a bucket's block (its buckets cut at blocks, as the trainer cuts a sharded
// level's) exists from the accumulation of its first gradient to its reduce-scatter, or, with the
// reduce-scatters overlapped (GradientShards::set_overlap), to the next bucket's start, and the
// step's peak with them is where the walk finds it, not the largest block beside the activations'.

#include "planner/plan.h"
#include "planner/profile_at.h"

#include <climits>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

namespace ht {

// training.gradient_dtype = "bf16" (runtime/mixed_precision.h): the plan's gradients are 16-bit.
// The profile is traced with fp32 gradients; a bf16 plan's gradient block is the same parameters
// at 2 bytes each (one block: alloc/gradient_buffer.h), its sharded blocks, shards and reductions
// the same elements at 2 bytes, and its run always has a block (never kept as backward makes them).
bool bf16_gradients(const Plan& plan);
// Bytes of one gradient element at the plan's type (the profile's own where fp32).
int64_t gradient_element_bytes(const ModelProfile& profile, const Plan& plan);
// The whole gradient block's arena bytes at the plan's type.
int64_t gradient_block_bytes(const ModelProfile& profile, const Plan& plan);
// The same plan with bf16 gradients where auto left the choice open, the plan trains in bf16 and
// takes one micro-batch a step (the search's twin where fp32 gradients do not fit:
// planner/search.cpp); nullopt otherwise. A search never chooses a bf16 running sum over
// micro-batches (the 70B search took it over 256 of them to be 2% faster than recomputing).
std::optional<Plan> bf16_gradients_twin(const Plan& plan);

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

// When each bucket's gradient block (cut at blocks) comes and goes along the trace: `first`, the
// end of the first kernel that makes one of its gradients (kNone: no kernel makes one), and, as
// the tape does it, where its block is made and where its reduce-scatter starts.
struct BucketTimes {
  static constexpr size_t kNone = static_cast<size_t>(-1);
  std::vector<size_t> first;
  // Where the bucket becomes ready (GradientShards starts it when the tape says its last gradient
  // is in): after the kernel that gives its last gradient (and every earlier bucket's) ends and
  // the tape frees the gradients it added up, before what the kernel read goes; `end` where none does.
  std::vector<size_t> ready;
  // Where its block is made (counted before that event): after the first gradient's kernel ends
  // and the frees of what it read, before the frees of what it made.
  std::vector<size_t> made_at;
  std::vector<int64_t> bytes;  // the block's, arena-rounded
};

// A trace folded for the walks along it (ZeRO-2's blocks, ZeRO-3's gathered buckets): the events
// where what a walk adds can change (a kernel's begin, a bucket's block made or its reduce-scatter
// started, backward's end) are visited one by one; between two of them only the trace's own bytes
// move, so each gap is its change and its highest point. A 70B step's 1.6 million events fold to
// a few thousand visits, and every walk along one trace (each prefetch, overlap and rank count)
// shares its fold: the walks read what they did event by event, to the byte.
struct StepFold {
  static constexpr int64_t kNoRise = INT64_MIN;  // a gap without events
  size_t end = 0;              // forward_backward_end
  BucketTimes times;           // the buckets' places (bytes: see gradient_block_steps)
  std::vector<size_t> at;      // the events visited, increasing; the last is `end`
  std::vector<int64_t> rise;   // before at[k]: the most the gap's events rise above its start (kNoRise: none)
  std::vector<int64_t> change; // before at[k]: what the gap's events change in all
  int64_t trailing = 0;        // trailing_frees at `end`
};
StepFold fold_step(const ModelProfile& profile, const StepTrace& trace);
// The fold of a shared trace, kept with the profile beside the last few traces folded.
std::shared_ptr<const StepFold> shared_step_fold(const ModelProfile& profile, const SharedTrace& trace);
// gradient_block_steps along a fold, at elements of `element_bytes`.
GradientBlockSteps gradient_block_steps(const ModelProfile& profile, const StepFold& fold, int64_t element_bytes,
                                        bool overlapped, const std::vector<int64_t>& part_bytes = {});
// The most the trace's bytes in use, the gradient blocks of `steps` and what `held_at(kernel)`
// adds from each kernel's begin to the next's reach together over [0, end], above the trace's own
// peak (the trace's frees after its last kernel taken at `end`).
int64_t walk_above_peak(const StepTrace& trace, const StepFold& fold, GradientBlockSteps& steps,
                        const std::function<int64_t(const TraceKernel&)>& held_at);
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
int64_t gradient_blocks_above_peak(const ModelProfile& profile, const StepTrace& trace, const StepFold& fold,
                                   int64_t element_bytes, bool overlapped, const std::vector<int64_t>& part_bytes = {});
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

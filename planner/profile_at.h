#pragma once
// A profile at a plan's sizes: forward and backward's time and bytes at any micro-batch (affine
// between the profiled points), the step's trace and graph resized to it, the batch's and the
// sampler's bytes; and what a node's ranks share (their threads, an all-reduce's ring). What every
// term of the cost model reads (planner/cost_model.h sums the terms).

#include "planner/machine.h"
#include "planner/profile.h"
#include "runtime/mixed_precision.h"
#include "schedule/step_graph.h"

#include <cstdint>
#include <vector>

namespace ht {

// Forward and backward of one micro-batch of `micro_batch` at `precision` on `threads`, from the
// profiled points: affine in the micro-batch between (or beyond) the two nearest measured sizes, scaled
// by the measured effect of fewer threads. Throws std::invalid_argument if no point has the
// precision.
double forward_backward_ms(const ModelProfile& profile, int64_t micro_batch, MixedPrecision precision,
                           int threads);
// Activation bytes of one micro-batch: affine between the two nearest measured sizes.
int64_t activation_bytes(const ModelProfile& profile, int64_t micro_batch, MixedPrecision precision);
// The optimizer step's working bytes: the largest measured at `precision` (no micro-batch in it).
int64_t optimizer_working_bytes(const ModelProfile& profile, MixedPrecision precision);
// The step trace scaled to `micro_batch` (sizes and times interpolated between the measured
// traces when they match op for op, proportional otherwise) with the batch of `local_batch`:
// shared, one of the last few made for the profile where it is (plans are predicted on several
// threads: the profile's recent traces are locked); trace_for is a copy of it to change.
SharedTrace shared_trace_for(const ModelProfile& profile, int64_t micro_batch, int64_t local_batch,
                             MixedPrecision precision);
StepTrace trace_for(const ModelProfile& profile, int64_t micro_batch, int64_t local_batch,
                    MixedPrecision precision);
// Each kernel of trace_for's trace at `micro_batch`, its op and its time alone (the same times,
// without making the trace): what a split of the step's time by op reads.
struct KernelTime {
  const char* op;
  bool backward;
  double ms;
};
std::vector<KernelTime> kernel_times(const ModelProfile& profile, int64_t micro_batch, MixedPrecision precision);
// The profiled step's graph (as static plans capture it) at `micro_batch`: bytes, kernel times and
// working bytes interpolated as trace_for does; `block_starts` (may be null) gets where each
// model block began. Empty when the profile captured no graph.
schedule::StepGraph graph_for(const ModelProfile& profile, int64_t micro_batch, MixedPrecision precision,
                              std::vector<int>* block_starts);
// Bytes of a step's batch of `samples` in the arena: the gathered input and target.
int64_t batch_bytes(const ModelProfile& profile, int64_t samples);
// Bytes of the sampler's order of an epoch of `samples` (int64 indices), kept across steps.
inline int64_t sampler_bytes(int64_t samples) { return arena_bytes(samples * 8); }
// Compute threads of one rank when `ranks_on_node` share a node (Machine::rank_threads where set),
// and the slowdown when the ranks' threads outnumber the node's (oversubscribed cores take turns).
int threads_per_rank(const Machine& machine, int ranks_on_node);
double oversubscription(const Machine& machine, int ranks_on_node);
// Ring all-reduce of `bytes` over `ranks` (alpha-beta): 2 (r-1) steps of bytes/r each.
// `stride`: the ranks between two members (a replica group's: the tensor-parallel size), which
// decides whether the ring stays within a node and, across nodes, through how many NICs of each
// node it runs (planner/machine.h, ring_link).
double allreduce_ms(const Machine& machine, int ranks, int64_t bytes, int stride = 1);

// Time at `threads` over time at the profile's threads (Amdahl's law through a point measured
// with one thread; 1 without one).
double thread_factor(const ModelProfile& profile, int threads);
// The points of `precision` measured with the profile's full thread count, by micro-batch; throws
// std::invalid_argument where there is none.
std::vector<const ProfilePoint*> base_points(const ModelProfile& profile, MixedPrecision precision);
// Backward's share of forward and backward, from the point's blocks (2/3 when unknown).
double backward_share(const ProfilePoint& p);

}  // namespace ht

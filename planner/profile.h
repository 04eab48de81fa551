#pragma once
// What the planner knows of a job before it searches: one profiled training step per measured
// point (micro-batch size, precision, threads), the model's state in bytes, and the machine.
// Plain data: the launcher measures it (launcher/planning/profiler.h), the planner reasons on it.

#include "planner/step_trace.h"
#include "planner/tensor_terms.h"
#include "runtime/mixed_precision.h"
#include "schedule/block_recorder.h"
#include "schedule/step_graph.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

namespace ht {

struct StepFold;  // planner/gradient_blocks.h

// Forward and backward time of one model block in one micro-batch.
struct BlockTime {
  double forward_ms = 0, backward_ms = 0;
};

// One measured step of one micro-batch (global batch = micro-batch size), after a warm-up step.
struct ProfilePoint {
  int64_t micro_batch = 0;
  MixedPrecision precision = MixedPrecision::kOff;  // training.mixed_precision
  int threads = 1;                // compute threads it ran with
  // Its memory from a step traced on meta tensors at this size, its times the measured points'
  // line (planner/traced_memory.h): a size the profiler did not train.
  bool memory_traced = false;
  double step_ms = 0;             // the whole step
  double forward_backward_ms = 0;  // forward and backward of the micro-batch
  double optimizer_ms = 0;        // gradient unscale, clip, optimizer step, zeroing
  int64_t peak_bytes = 0;         // arena peak of the step, everything included
  // The step's two phases: forward and backward (to the end of the last micro-batch's backward),
  // and the optimizer's (the gradients' averaging, clipping, the step, zeroing); peak_bytes is
  // the larger.
  int64_t forward_backward_peak_bytes = 0;
  int64_t optimizer_peak_bytes = 0;
  int64_t persistent_bytes = 0;   // arena bytes in use when the step began
  int64_t batch_bytes = 0;        // the step's batch (input and target), rounded
  std::vector<BlockTime> blocks;  // per model block; the loss is not a block
  // Per model block b: the bytes one micro-batch sends forward across a pipeline cut after b (the
  // trace's tensors made up to b and read by a later block's forward; planner/pipeline_terms.h).
  std::vector<int64_t> cut_bytes;
  // Per model block: what its forward leaves for backward, the most its kernels see of that and
  // of the step's transient tensors, and what crosses the cut after it that no block keeps
  // (planner/pipeline_terms.h, block_memory): a pipeline stage's memory.
  std::vector<int64_t> block_held_bytes, block_peak_bytes, block_peak_backward_bytes, block_sent_unheld_bytes,
      block_sent_held_bytes;
  // The part of block_held_bytes that is the block's weights' casts, and the peaks without those
  // casts: where the weights' 16-bit copies are kept (planner/pipeline_terms.h, BlockMemory).
  std::vector<int64_t> block_weight_cast_bytes, block_peak_without_casts_bytes, block_peak_backward_without_casts_bytes;
  StepTrace trace;                // for the DTR replay
  // The same step as static plans capture it (memory/step_capture.h), for predicting a plan.
  schedule::StepGraph graph;
  std::vector<int> block_starts;  // forward op index at which each model block began (segments)
  // The buckets (ModelProfile::block_buckets) holding a weight backward read at this precision:
  // what sharded parameters gather again in backward (under autocast a block whose weights are all
  // cast reads only the copies forward kept; a norm's fp32 weight is read again).
  std::vector<size_t> backward_read_buckets;
  // What 16-bit gathers gather (parallel/parameter_shards.h, keep_copies): the buckets holding a
  // weight autocast casts (their 16-bit copies, gathered whole in forward; in backward again where
  // backward_copy_buckets below says),
  // and per bucket the elements of the weights read in fp32 (gathered alone: norms' gains, an
  // embedding's table), sorted by bucket.
  std::vector<size_t> half_read_buckets;
  // What 16-bit gathers gather again in backward: the buckets holding a weight whose cast the tape
  // saved (a product whose other input needs a gradient saves it; a first layer's does not), and
  // those holding a weight it saved as it is (a norm's gain; not an embedding's table, which the
  // lookup does not save, though the cast step reads it after the last block for a tied head).
  std::vector<size_t> backward_copy_buckets;
  std::vector<size_t> backward_fp32_buckets;
  std::vector<std::pair<size_t, int64_t>> fp32_read_elements;
  // Forward and backward's peak minus what does not scale with the micro-batch: the activations'.
  int64_t activation_bytes() const { return forward_backward_peak_bytes - persistent_bytes - batch_bytes; }
  // The optimizer's working memory above the state and the batch: temporaries the size of the
  // largest tensor it steps (AdamW: two), whatever the micro-batch.
  int64_t optimizer_working_bytes() const {
    return optimizer_peak_bytes > 0 ? std::max<int64_t>(0, optimizer_peak_bytes - persistent_bytes - batch_bytes) : 0;
  }
};

// One micro-batch replayed with every block but the last dropped at its end (memory.policy =
// "full"; planner/cost_model.cpp), without the model's state.
struct BlockRecomputeReplay {
  int64_t kept_bytes = 0;     // what forward leaves: the blocks' outputs
  int64_t working_bytes = 0;  // what backward adds at most while it regenerates a block
  double recompute_ms = 0;    // the regenerations' kernels
  int64_t evictions = 0;
  bool budget_acted = false;  // ReplayResult's
  std::string failure;        // empty: the replay ran in the budget
  int64_t min_budget_bytes = 0;  // when it did not: what it would have needed at least
  // Under per_block: the block run most often (the repeating one) and its plan, at the replayed
  // micro-batch (the smaller of two on a line: its kinds and shares are the same at every size).
  std::shared_ptr<const schedule::SolvedBlock> block;
  int64_t block_micro_batch = 0;  // the micro-batch `block` was replayed at
  // memory.block_offload: one micro-batch's bytes copied to host and back, and the link's time its
  // compute does not hide (ReplayResult's).
  int64_t offload_out_bytes = 0, offload_in_bytes = 0;
  double offload_exposed_ms = 0;
};

struct ModelProfile {
  std::string model;
  std::string optimizer;          // training.optimizer
  int64_t parameters = 0;         // count
  // Arena bytes (each tensor rounded as the arena rounds), exact, from the model itself:
  int64_t parameter_bytes = 0;
  std::vector<int64_t> block_parameter_bytes;  // per model block: what it registers
  // Per model block, the parameters it reads that another block registers (a tied embedding in
  // the head): a pipeline stage without the registering block trains a copy of each, with its
  // gradient and optimizer state (parallel/pipeline_layout.h).
  struct TiedRead {
    int parameter = 0;      // in the model's parameters() order
    int registered_by = 0;  // the block holding it
    int64_t bytes = 0;      // arena bytes
  };
  std::vector<std::vector<TiedRead>> block_tied_reads;
  int64_t gradient_bytes = 0;     // the gradient block
  int64_t optimizer_state_bytes = 0;
  // Each of DataParallel's buckets (parallel.bucket_mb), in reduction order: its parameters'
  // element counts, what sharding splits among the ranks (planner/shard_terms.h).
  std::vector<std::vector<int64_t>> buckets;
  // The same with buckets cut where blocks end (what sharded parameters gather a block at a
  // time), and per block the indices of those buckets it reads (its own and tied ones).
  std::vector<std::vector<int64_t>> block_buckets;
  std::vector<std::vector<size_t>> block_bucket_uses;
  int64_t input_sample_bytes = 0;   // one sample's input, unrounded
  int64_t target_sample_bytes = 0;  // one sample's target
  int64_t train_samples = 0;      // the training set's size (the sampler keeps an order of it)
  int64_t tokens_per_sample = 0;  // a language model's sequence length; 0 for other tasks
  int64_t global_batch = 0;       // training.global_batch_size
  int64_t steps_per_epoch = 0;    // of the global batch
  int threads = 1;                // the threads a single rank computes with here
  std::vector<ProfilePoint> points;
  double seconds = 0;             // the profiling took
  std::string how = "measured";   // or how it was traced and priced, for the report
  // The points' times were measured here (else priced from each kernel's work, affine in the
  // micro-batch: launcher/planning/trace_profile.h). Measured times carry this machine's drift,
  // so nothing is extrapolated from two nearby sizes of them (planner/recompute_terms.cpp).
  bool times_measured = true;
  // A split model's profile is one rank's part of it (parallel.tensor_parallel): its memory and
  // kernels; the group's collectives are modelled from the shape (planner/tensor_terms.h).
  int tensor_parallel = 1;
  bool sequence_parallel = false;
  // A context-parallel profile is rank 0's chunks of every sequence (parallel.context_parallel):
  // its memory and kernels, the attention's exchanges with its group mirrored; their time is
  // modelled from the shape (planner/context_terms.h).
  int context_parallel = 1;
  ContextExchange context_exchange = ContextExchange::kRing;
  TensorShape tensor_shape;       // a decoder's, the whole sequence's; undefined for other models
  // The cost model's replays of full recomputation (and per_block's) by (micro-batch, precision,
  // budget, per_block's bytes kept a block, or its share, and memory.block_offload's link: its
  // time per byte and host bytes a block, 0 and 0 without): a search predicts many plans of each.
  mutable std::map<std::tuple<int64_t, int, int64_t, int64_t, double, double, int64_t>, BlockRecomputeReplay>
      full_recompute_replays;
  // ZeRO-2's gradient blocks along the step by (micro-batch, precision, overlapped, ranks with
  // accumulation): planner/shard_terms.h, gradient_blocks_term.
  // (the last elements: the step walked without the weights' casts, for kept copies, and bf16 gradients, training.gradient_dtype).
  mutable std::map<std::tuple<int64_t, int, bool, int, bool, bool>, int64_t> gradient_block_walks;
  // What a step's live peak loses without the weights' casts by (micro-batch, precision):
  // planner/weight_copy_terms.h, activations_without_casts_change.
  mutable std::map<std::pair<int64_t, int>, int64_t> uncast_peak_changes;
  // The weights' casts alive at a point's traced peak by its (micro-batch, precision, threads)
  // (planner/weight_copy_terms.h): two walks of its trace, asked by every plan that keeps copies.
  mutable std::map<std::tuple<int64_t, int, int>, int64_t> casts_alive_at_peak;
  // Gradients kept as backward makes them by (micro-batch, precision): planner/gradient_blocks.h,
  // kept_gradients_term.
  mutable std::map<std::pair<int64_t, int>, int64_t> kept_gradient_walks;
  // The last steps trace_for made (shared_trace_for), by (micro-batch, local batch, precision):
  // a search predicts its plans in the order of their sizes, and a 70B step is a trace of 26 MB,
  // copied and resized for each plan before (most of a search's time).
  struct RecentTrace {
    int64_t micro_batch = 0, local_batch = 0;
    int precision = 0;
    std::shared_ptr<const StepTrace> trace;
  };
  mutable std::vector<RecentTrace> recent_traces;
  // ZeRO-3's gathered buckets along the step by (micro-batch, precision, prefetch,
  // overlapped, ranks with accumulation, 16-bit gathers: 0 none, 1 under a policy, 2 without):
  // planner/shard_terms.h, shard_memory_terms.
  // (and bf16 gradients' blocks, training.gradient_dtype)
  mutable std::map<std::tuple<int64_t, int, int, bool, int, int, bool>, int64_t> gathered_walks;
  // The last few traces' folds for the walks along them (planner/gradient_blocks.h, StepFold),
  // each beside the trace it folds.
  mutable std::vector<std::pair<std::shared_ptr<const StepTrace>, std::shared_ptr<const StepFold>>> step_folds;
  // The last few traces without the weights' casts (planner/weight_copy_terms.h), each beside the
  // trace it is made from.
  mutable std::vector<std::pair<std::shared_ptr<const StepTrace>, std::shared_ptr<const StepTrace>>> uncast_traces;
};

// Per model block, the forward and backward time of its kernels in `trace` (kernels outside the
// blocks, the loss's, left out).
inline std::vector<BlockTime> block_times(const StepTrace& trace, size_t blocks) {
  std::vector<BlockTime> out(blocks);
  for (const TraceKernel& k : trace.kernels) {
    if (k.block < 0 || static_cast<size_t>(k.block) >= blocks) continue;
    BlockTime& b = out[static_cast<size_t>(k.block)];
    (k.backward ? b.backward_ms : b.forward_ms) += k.ms;
  }
  return out;
}

// Bytes a tensor of `bytes` takes in the arena (CpuArena rounds every block to 64 bytes).
inline int64_t arena_bytes(int64_t bytes) {
  constexpr int64_t kAlignment = 64;
  return bytes <= 0 ? kAlignment : (bytes + kAlignment - 1) / kAlignment * kAlignment;
}

}  // namespace ht

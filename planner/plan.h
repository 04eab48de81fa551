#pragma once
// What the planner chooses among and what it predicts: a Plan (one way to train the job: the
// grid's degrees, the micro-batches, the precision, the memory policy and budget, the shard level)
// and its Prediction (memory per rank and time per step, each term on its own). Plain data, read by
// every term of the cost model (planner/cost_model.h) and by the search (planner/search.h).

#include "memory/memory_policy.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/shard_layout.h"
#include "runtime/context_parallel.h"
#include "runtime/mixed_precision.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

namespace ht {

// memory.policy = "per_block": the shares of what each block's backward reads that the search
// and the run check try (Plan::block_keep_share), three quarters, a half and a quarter.
inline constexpr double kBlockKeepLadder[] = {0.75, 0.5, 0.25};
// Per pipeline stage (Plan::block_keep_by_stage): everything, the ladder, and nothing (full).
inline constexpr double kStageKeepLadder[] = {0.75, 0.5, 0.25, 0.0};

// How a plan's layers and sequences are split among a replica's ranks: the profile a plan is
// predicted from is one rank's part of the model at this split (tensor-parallel size, context-
// parallel size and, with c > 1, how the context group's attention exchanges keys and values:
// the ring holds two chunks of them while it runs, the gathers the whole sequence's), so the
// search keys its profiles by it. One context rank has no exchange: kRing, always.
struct RankSplit {
  int tensor = 1, context = 1;
  ContextExchange exchange = ContextExchange::kRing;
  bool operator<(const RankSplit& o) const {
    return std::tie(tensor, context, exchange) < std::tie(o.tensor, o.context, o.exchange);
  }
  bool operator==(const RankSplit& o) const {
    return tensor == o.tensor && context == o.context && exchange == o.exchange;
  }
};

// One way to train the job: what the search chooses among.
struct Plan {
  int ranks = 1;                  // data-parallel ranks (replicas)
  int64_t micro_batch = 0;        // samples per micro-batch on a rank
  int64_t accumulation = 1;       // micro-batches per step on a rank
  MixedPrecision precision = MixedPrecision::kOff;  // training.mixed_precision
  MemoryPolicy policy = MemoryPolicy::kNone;        // memory.policy
  int64_t budget_bytes = 0;       // memory.budget; 0: none
  int64_t block_keep_bytes = 0;   // memory.block_keep under per_block: what each block keeps,
  double block_keep_share = 0;    // or this share of what its backward reads (the search's ladder)
  // per_block on pipeline stages: each stage's share (memory.block_keep = "25%,75%"; 0: its full
  // recomputation), block_keep_share then the first's; empty: block_keep_* on every stage.
  std::vector<double> stage_block_keep;
  // The search's per-stage candidate: the ranking gives each stage the largest share of
  // kStageKeepLadder that fits it, and writes them to stage_block_keep (planner/search.h).
  bool block_keep_by_stage = false;
  // memory.block_offload: per_block plans may offload values to host (schedule::BlockLink), within
  // host_budget_bytes (0: half the machine's host memory) at the machine's host link.
  bool block_offload = false;
  int64_t host_budget_bytes = 0;
  // memory.eviction_threshold: under eviction, what each kernel evicts down to, as a share of the
  // budget (host swap takes at most 0.9, as the runtime does).
  double eviction_threshold = 0.9;
  int stages = 1;                 // pipeline stages per replica (parallel.pipeline_parallel)
  ScheduleKind schedule = ScheduleKind::k1f1b;  // parallel.pipeline_schedule, with stages > 1
  int virtual_stages = 1;  // parallel.virtual_stages: chunks per stage (interleaved_1f1b)
  // parallel.stage_blocks: blocks per (virtual) stage in model order; empty: cut where the
  // profile's block times balance (a ranked plan carries the cut it was predicted for).
  std::vector<int> stage_blocks;
  // memory.optimizer_state = "host" (policies swap and hybrid): the optimizer state waits on host
  // during forward and backward, and crosses the link twice a step.
  bool state_on_host = false;
  // memory.plan_first_step: under static plans the first step is planned ahead from a trace (one
  // rank's whole model), so DTR need not run it; false: it runs under DTR while it is captured.
  bool plan_first_step = true;
  ShardLevel shard = ShardLevel::kNone;  // parallel.shard (planner/shard_terms.h)
  int prefetch = 1;  // parallel.prefetch: blocks gathered ahead at "parameters" (none under a budget with eviction)
  bool overlap = true;  // parallel.overlap: all-reduces, or sharded gradients' reduce-scatters, during backward
  int tensor = 1;       // ranks each layer is split across (parallel.tensor_parallel; planner/tensor_terms.h)
  bool sequence_parallel = false;  // parallel.sequence_parallel, with tensor > 1
  // Ranks each sequence is split across (parallel.context_parallel; planner/context_terms.h), and
  // how their attention exchanges keys and values (parallel.context_exchange).
  int context = 1;
  ContextExchange context_exchange = ContextExchange::kRing;
  // checkpoint.async: checkpoints are copied to host memory and written while training goes on
  // (training/checkpointing.h); the copy is host memory beside the step's (checkpoint_terms).
  bool async_checkpoint = false;
  // training.compute_weights under 16 bits (planner/weight_copy_terms.h).
  ComputeWeightsMode compute_weights = ComputeWeightsMode::kAuto;
  // training.gradient_dtype under bf16 (planner/gradient_blocks.h, gradient_element_bytes).
  GradientDtype gradient_dtype = GradientDtype::kAuto;
  int devices() const { return ranks * stages * tensor * context; }
  // The ranks that hold the same weights: the data-parallel group that averages the gradients
  // and that ZeRO shards the state over (each replica's context ranks among them).
  int weight_replicas() const { return ranks * context; }
  RankSplit split() const { return {tensor, context, context > 1 ? context_exchange : ContextExchange::kRing}; }
};

// What the model predicts for a plan, each term on its own.
struct Prediction {
  // Memory per rank (arena bytes).
  int64_t model_bytes = 0;            // parameters and buffers
  int64_t gradient_bytes = 0;
  int64_t optimizer_state_bytes = 0;
  int64_t sampler_bytes = 0;          // the epoch's order of samples
  int64_t batch_bytes = 0;            // the rank's share of the global batch
  int64_t activation_bytes = 0;       // the largest working set of forward and backward
  int64_t optimizer_working_bytes = 0;  // the optimizer step's temporaries (beside the state)
  // The state and batch plus the larger of the two working sets, or under a budget with eviction
  // the replay's peak.
  int64_t peak_bytes = 0;
  bool fits = true;                   // peak within the device memory (and the budget feasible)
  std::string why_not;                // when it does not fit
  // Under eviction: the replay runs the step in the budget, but not in the margin below it kept
  // for what it cannot see; nothing else keeps it from fitting. A search passes such a plan over
  // (it prefers room to spare); the fit check of a configured run lets it train, with a warning.
  bool within_margin = false;
  // Time per step (ms) on one rank.
  double compute_ms = 0;              // forward and backward of every micro-batch
  double recompute_ms = 0;            // what eviction re-runs (the replay's), every micro-batch
  // Kept 16-bit weight copies: their bytes (beside the optimizer step's temporaries) and the casts
  // they save (included in compute_ms and recompute_ms); 0 where the weights are cast at each read.
  int64_t weight_copy_bytes = 0;
  double weight_casts_saved_ms = 0;
  double optimizer_ms = 0;            // optimizer step, clipping, the batch's gather
  double allreduce_ms = 0;            // all-reduce of the gradients, in all
  double allreduce_exposed_ms = 0;    // the part not hidden under backward
  double gather_ms = 0;               // sharding: the all-gathers the step waits for (after the step; ZeRO-3: of each block)
  double gather_hidden_ms = 0;        // ZeRO-3 with prefetch: the all-gathers' time hidden under compute
  double tensor_ms = 0;               // tensor parallelism: the group's collectives, on the critical path
  double context_ms = 0;              // context parallelism: the attention's exchanges the step waits for
  double bubble_ms = 0;               // pipelines: stages idle, part of compute_ms
  double transfer_ms = 0;             // pipelines: the step's wait for stage-to-stage messages, part of bubble_ms
  double stage_imbalance = 1;         // pipelines: slowest stage / mean stage
  double stage_state_share = 1;       // pipelines: the fullest stage's share of the model's state
  std::vector<int> stage_blocks;      // pipelines: the blocks of each (virtual) stage, as cut
  // pipelines: each rank's peak, counted as peak_bytes is (what every rank holds beside its
  // stage's state and activations included); and the bytes fit_terms held peak_bytes against
  // (the room less its margin; 0 where it did not check).
  std::vector<int64_t> stage_peak_bytes;
  int64_t usable_bytes = 0;
  int64_t evictions = 0;              // per step (replay), or values a static plan drops
  // Host swap (policies swap and hybrid; planner/swap_terms.h), per step.
  int64_t swap_out_bytes = 0;         // copied to host memory
  double swap_link_ms = 0;            // the link's time for those bytes out and back in
  double swap_exposed_ms = 0;         // the part compute waits for (not hidden under it)
  bool static_plan = false;           // steps run on a static plan (else, under a budget, DTR)
  // checkpoint.async: the host memory the fullest rank's copy of a checkpoint holds while it is
  // written (its share of the parameters and optimizer state; a whole checkpoint's writer, all).
  int64_t checkpoint_host_bytes = 0;
  double step_ms = 0;
  double samples_per_s = 0;           // global batch per step time
  // Model FLOPs utilization: the step's forward and backward work (three times forward's, no
  // recomputation counted) over the time at the device's dense peak; 0 where the peak is not known.
  double mfu = 0;
  double device_hours_per_epoch = 0;  // ranks x step time x steps per epoch
  // A language model's: tokens a second, and device-hours per billion tokens (0 for other models).
  double tokens_per_s = 0;
  double device_hours_per_billion_tokens = 0;

  // The model's state on a rank: parameters (and buffers), gradients, optimizer state.
  int64_t state_bytes() const { return model_bytes + gradient_bytes + optimizer_state_bytes; }
  // What lives through the whole step: the state, the sampler's order and the batch.
  int64_t fixed_bytes() const { return state_bytes() + sampler_bytes + batch_bytes; }
  // The peak without eviction: the fixed bytes and the larger of the step's two working sets
  // (forward and backward's activations, the optimizer step's temporaries).
  int64_t working_peak_bytes() const { return fixed_bytes() + std::max(activation_bytes, optimizer_working_bytes); }
};

}  // namespace ht

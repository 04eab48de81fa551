#pragma once
// The one resolved plan: how this rank trains, decided once when the job is built (after the
// config's validation, the planner's automatic choices and the fit check) and read by every part
// of the trainer, never changed after. The config says what the user wrote ("auto", "60%", 0 for
// "every rank", a micro-batch of 0 for "the whole local batch"); the plan says what was decided
// (a policy, bytes, counts, this rank's place in the grid). Nothing is kept in both forms: the
// budget's bytes, the replicas and the micro-batches live here only. launcher/config/run_plan_of.h
// makes it from a Config and the process grid, and writes it back out as the config keys that train
// it (config.resolved.toml, plan.toml).

#include "memory/memory_policy.h"
#include "parallel/pipeline_links.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/shard_layout.h"
#include "parallel/stage_partition.h"
#include "runtime/mixed_precision.h"
#include "training/loss_scaler.h"
#include "training/optimizer_options.h"

#include <cstdint>
#include <string>
#include <vector>

namespace ht {

// The grid's axes, as torchtitan's ParallelDims: world = data x context x tensor x pipeline,
// ordered as parallel/process_grid.h orders the ranks; and this rank's coordinates on each axis.
// The context axis splits every sequence among the ranks of a group (runtime/context_parallel.h):
// the data x context ranks hold the same weights and average their gradients; the context ranks of
// a replica train the same samples, each on its chunks of them.
struct GridPlan {
  int data = 1, context = 1, tensor = 1, pipeline = 1;  // degrees
  int replica = 0, context_rank = 0, tensor_rank = 0, stage = 0;  // this rank's place
  bool sequence_parallel = false;  // with tensor > 1: norms and the residual stream in pieces
  int world() const { return data * context * tensor * pipeline; }
  // Rank 0 of the job: the one that prints and writes the outputs.
  bool first_rank() const { return replica == 0 && context_rank == 0 && tensor_rank == 0 && stage == 0; }
};

// One optimizer step's samples: `global` over every replica, `micro` per forward and backward,
// `micro_batches` of them on each replica (gradient accumulation).
struct BatchPlan {
  int64_t global = 64;
  int64_t micro = 64;
  int64_t micro_batches = 1;
  int64_t local() const { return micro * micro_batches; }  // one replica's share of a step
};

// [memory], decided: the budget in bytes (0: none) and the policy the run trains under (never
// "auto" where the planner chose one; "auto" left as it is means its static plans won).
struct MemoryPlan {
  int64_t budget_bytes = 0;
  MemoryPolicy policy = MemoryPolicy::kNone;
  // per_block: bytes each block keeps through forward, as its plan chooses (MemoryOptions::block_keep_bytes).
  int64_t block_keep_bytes = 0;
  double block_keep_share = 0;  // or this share of what each block's backward reads (memory.block_keep = "40%")
  // memory.block_keep = "25%,75%": each pipeline stage's share (AdaPipe's plan: the first stage,
  // holding the most micro-batches in flight, keeps least); this rank's is block_keep_share, a
  // share of 0 its full recomputation. Empty: block_keep_* on every stage.
  std::vector<double> stage_block_keep;
  // per_block: each block's plan may offload values to host (host_budget_bytes, host_link_gbps)
  // as well as keep them (memory.block_offload).
  bool block_offload = false;
  bool uses_host_link() const { return ht::uses_host_link(policy, block_offload); }
  // Neither, where the run check does not choose (a GPU, pipeline stages, tensor parallelism): this.
  static constexpr double kDefaultBlockKeepShare = 0.5;
  double eviction_threshold = 0.9;
  bool sqrt_sampling = false;
  bool ignore_small = true;
  bool eviction_window = true;
  KernelCosts kernel_costs = KernelCosts::kModeled;
  double solve_time_s = 10;
  bool static_layout = true;
  bool plan_first_step = true;
  // Host swap and the optimizer state's place.
  int64_t host_budget_bytes = 0;
  double host_link_gbps = 25;
  Compression compress = Compression::kOff;
  StatePlace optimizer_state = StatePlace::kDevice;
  bool host_cache = true;
  bool trace = false;
  int64_t trace_steps = 2;
};

// How the data-parallel replicas combine gradients and split the model's state (ZeRO), and how
// long any collective may take.
struct SyncPlan {
  ShardLevel shard = ShardLevel::kNone;  // kNone wherever there is one replica
  int64_t bucket_bytes = int64_t{25} << 20;
  bool overlap = true;
  int64_t prefetch = 1;  // sharded parameters: blocks gathered ahead
  double timeout_s = 300;
};

// Pipeline stages (GridPlan::pipeline > 1): the schedule and the cut.
struct PipelinePlan {
  ScheduleKind schedule = ScheduleKind::k1f1b;
  int64_t virtual_stages = 1;
  std::vector<int64_t> stage_blocks;  // empty: balanced by the blocks' costs
  StageCosts stage_costs = StageCosts::kMeasured;
  PipelineP2p p2p = PipelineP2p::kAuto;  // on CPU ranks: MPI's matching by tag, or NCCL's (nccl_like)
  // Whether the stages' group matches their messages in posting order (NCCL, nccl_like: the
  // serial streams the planner plays), as the launcher made the group; by tag otherwise (MPI,
  // ranks sharing a GPU included).
  bool posting_order = false;
};

// The training loop around the steps: how many, when to evaluate, log and checkpoint, where.
struct LoopPlan {
  int64_t steps = 0;   // 0: `epochs` over the training set
  int64_t epochs = 1;
  bool shuffle = true;
  int64_t eval_interval = 0;  // 0: every epoch
  // Samples evaluated: eval_batches of a single-rank run's batches (the ranks share them); 0: the
  // whole evaluation split.
  int64_t eval_samples = 0;
  int64_t log_interval = 10;
  bool time_by_op = false;
  int64_t checkpoint_interval = 0;
  int64_t checkpoint_keep = 3;
  bool checkpoint_async = false;  // written by a thread of its own while training goes on
  std::string checkpoint_dir = "runs/run/checkpoints";
  std::string output_dir = "runs/run";
};

struct RunPlan {
  std::string device = "cpu";  // this rank's: "cuda:<n>" under mpirun on GPUs
  uint64_t seed = 1;
  bool channels_last = true;   // image models' convolution weights
  GridPlan grid;
  BatchPlan batch;
  MemoryPlan memory;
  SyncPlan sync;
  PipelinePlan pipeline;
  MixedPrecision precision = MixedPrecision::kOff;
  ComputeWeightsMode compute_weights = ComputeWeightsMode::kAuto;  // 16-bit precisions
  GradientDtype gradient_dtype = GradientDtype::kAuto;  // bf16 precision: the gradients' type
  LossScalerOptions loss_scale;  // fp16
  OptimizerOptions optimizer;
  LoopPlan loop;
  std::string source;  // the config file it was resolved from, for messages
};

}  // namespace ht

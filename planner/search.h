#pragma once
// The search over plans: every data-parallel rank count, micro-batch size (accumulating to the
// same global batch), precision and memory policy the options allow, each predicted by the cost
// model, ranked by the objective; and the sentence on why the winner wins, in numbers.

#include "planner/plan.h"

#include <functional>
#include <string>
#include <vector>

namespace ht {

enum class Objective { kTime, kCost };  // fastest step, or fewest device-hours per epoch

struct SearchOptions {
  std::vector<int> ranks{1};                          // rank counts to consider (replicas x stages)
  Objective objective = Objective::kTime;
  std::vector<MixedPrecision> precisions{MixedPrecision::kOff, MixedPrecision::kBf16};
  std::vector<MemoryPolicy> policies{MemoryPolicy::kNone, MemoryPolicy::kDtr};  // eviction needs device memory
  int max_accumulation = 32;                          // micro-batches per step, at most
  std::vector<int> stages{1};                         // pipeline stages to consider, each dividing a rank count
  // Sharding levels for plans of several replicas and one stage (one replica: none only).
  std::vector<ShardLevel> shards{ShardLevel::kNone};
  // The splits of a replica's ranks to consider (one profile each): tensor-parallel group sizes
  // (1: none), each with or without sequence parallelism as `sequence_parallel` says, and context
  // groups (1: none), each exchanging keys and values as its split says (the same size with both
  // exchanges: two splits); a plan's tensor x context ranks divide its rank count with its
  // stages, and its ranks are its replicas' context ranks too.
  std::vector<RankSplit> splits{RankSplit{}};
  bool sequence_parallel = true;
  bool async_checkpoint = false;  // checkpoint.async: every plan holds its copy (Plan::async_checkpoint)
  // per_block also with memory.block_offload, at every share and at none (where the device is the
  // host: CPU ranks; on a GPU the CUDA host link is not built), without tensor parallelism or ZeRO-3.
  bool block_offload = false;
  // > 1: pipelines also as interleaved_1f1b with this many chunks per stage (Megatron's schedule:
  // a smaller bubble for more messages), where the micro-batches allow it.
  int virtual_stages = 1;
  // training.gradient_dtype as configured: every candidate's (auto: fp32, and bf16 where fp32 does
  // not fit and the plan trains in bf16: rank_plans tries the twin, bf16_gradients_twin).
  GradientDtype gradient_dtype = GradientDtype::kAuto;
};

struct RankedPlan {
  Plan plan;
  Prediction prediction;
};

// Every plan of `global_batch` the options allow; a budget (the device's memory) on each when
// the machine's memory is known.
std::vector<Plan> candidate_plans(int64_t global_batch, int64_t device_memory, const SearchOptions& options);
// Fitting plans first, best first by the objective (ties: fewer ranks, then faster); then the
// rest by predicted peak. Predicts on up to `threads` threads (the cores this process may use:
// its affinity and cgroup quota, which std::thread::hardware_concurrency does not see); the
// ranking is the same at any count.
std::vector<RankedPlan> rank_plans(const std::vector<Plan>& plans,
                                   const std::function<Prediction(const Plan&)>& predict_plan,
                                   Objective objective, int threads = 1);
// A plan in words: "2 ranks, micro-batch 32 x 2, bf16, dtr".
std::string describe_plan(const Plan& plan);

// memory.policy = "per_block" without memory.block_keep: the share of what each block's backward
// reads, of the ladder (kBlockKeepLadder) and none (full's drops: where DTR would evict what the
// plan keeps), that `predict_plan` says trains `plan` fastest within its budget; 0 where none fits.
// `words`: each share's predicted step, for the log.
double fastest_block_keep(const Plan& plan, const std::function<Prediction(const Plan&)>& predict_plan,
                          std::string& words);
// per_block on pipeline stages (Plan::block_keep_by_stage): AdaPipe's per-stage plan. From each
// of the two highest shares of kStageKeepLadder that fit on every stage (the uniform plans), the
// stages are raised one rung at a time, the raise that makes the predicted step fastest first,
// while one does (the later stages hold fewer micro-batches in flight; pipeline_terms balances
// the cut with each stage's recomputation, within the device). The fastest that fits; where
// none does, the first tried (every stage at the top share). Sets plan.stage_block_keep (and block_keep_share, the first
// stage's); `predict_plan` may change the plan as predict_with_weights_that_fit does.
Prediction predict_stage_keeps(Plan& plan, const std::function<Prediction(Plan&)>& predict_plan);
// The shares of a per-stage plan in words: "100%, 75%, 25%, 0%".
std::string stage_keep_words(const std::vector<double>& shares);
// The memory policy as the plans' tables name it: "dtr", "per_block 50%", per stage
// "per_block 100/75/25/0%".
std::string policy_cell(const Plan& plan);
// The plan in words with its budget: "2 ranks, micro-batch 32 x 2, bf16, dtr at 256.0 MiB".
std::string plan_words(const Plan& plan);
// One or two sentences on why ranked[0] wins, against the best plan of other rank counts and
// against (or for) trading compute for memory. Empty when nothing fits.
std::string why_it_wins(const std::vector<RankedPlan>& ranked, Objective objective);

}  // namespace ht

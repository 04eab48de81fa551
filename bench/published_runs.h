#pragma once
// Published large-model training runs with their full configurations, for bench_planner_at_scale:
// each row is a held-out test of the planner's device and communication model (never a fit),
// cited to its table. docs/planner-at-scale.md quotes them with the benchmark's output.

#include "launcher/config/config.h"

#include <string>
#include <vector>

namespace ht::bench {

// What the published run recomputed (Korthikanti et al. 2022's terms).
enum class Recompute {
  kNone,
  // Attention's softmax, dropout and the product with V: what our attention op never saves (it
  // keeps q, k, v, its output and a row statistic, as flash attention does): nothing to add.
  kSelective,
  // Every transformer layer's forward again in its backward, keeping only the layer's input
  // (Megatron's --recompute-granularity full): ours runs it too (memory.policy = "full").
  kFull,
};

// How the published figure is stated; each is turned into seconds per iteration.
enum class Figure {
  kIterationSeconds,
  // teraFLOP/s per GPU by Narayanan et al. 2021's count, 96 B s l h^2 (1 + s / 6h + V / 16lh) per
  // iteration (a forward, a backward and the full recomputation's forward).
  kMegatronTflopsPerGpu,
  // Korthikanti et al. 2022's model FLOPs, 72 B s l h^2 (1 + s / 6h + V / 12lh), the same count
  // without the recomputation.
  kModelTflopsPerGpu,
  kTokensPerSecondPerGpu,  // tokens (words) per second per GPU, torchtitan's WPS
};

struct PublishedRun {
  std::string id;      // short name in the table
  std::string source;  // paper or page, and table
  std::string base;    // config under configs/ with the model's family
  std::vector<std::string> model;  // "model.key=value" overrides giving the published shape
  std::string device;              // catalog kind (configs/devices.toml)
  int nodes = 1, per_node = 8;
  double inter_node_gbps = 0;  // GB/s a device has between nodes where the published cluster says; 0: the catalog's
  int data = 1, tensor = 1, stages = 1;
  bool sequence_parallel = false;
  ShardLevel shard = ShardLevel::kNone;
  int64_t global_batch = 0, micro_batch = 1;
  Recompute recompute = Recompute::kNone;
  MixedPrecision precision = MixedPrecision::kBf16;
  Figure figure = Figure::kIterationSeconds;
  double value = 0;       // the figure as published
  double published_mfu = 0;  // as published, 0 where not
  int virtual_stages = 1;    // > 1: the interleaved schedule with this many chunks per stage (ours runs it too)
  // Mechanisms of the published trainer that ours lacks, priced by the same device and link
  // model for the "as run" column (bench/planner_at_scale.cpp says how):
  bool fused_optimizer = false;      // one fused AdamW kernel (apex's, DeepSpeed's, torch's fused=True)
  bool tp_backward_overlap = false;  // Megatron: backward's tensor-parallel collectives under the weight-gradient GEMMs
  bool half_gathers = false;         // FSDP's mixed precision: parameters gathered in bf16
  // Weights kept (or gathered) in 16 bits: no per-micro-batch cast of the fp32 weights, as
  // autocast makes in ours (Megatron's fp16 module, DeepSpeed's bf16 one, FSDP's gathers).
  bool half_weights = false;
  // The weight-gradient GEMM accumulates into the fp32 gradient (Megatron's
  // gradient_accumulation_fusion): no pass casting each micro-batch's gradients into it.
  bool fused_accumulation = false;
  // Each micro-batch's 16-bit gradients cast into fp32 and then added (DeepSpeed's bf16 optimizer),
  // where ours, keeping copies, widens each copy's gradient as it adds it: one pass more.
  bool casts_gradients = false;
  // torchtitan's selective op checkpointing (activation_checkpoint mode "selective", option "op"):
  // each transformer block keeps its matmuls' outputs but every second one's, and attention's;
  // backward recomputes the rest of its forward (torchtitan's _apply_ac, _custom_policy).
  bool op_checkpointing = false;
  // What the published system did that ours does not, and how the prediction accounts for it.
  std::string differs;
  int devices() const { return data * tensor * stages; }
};

std::vector<PublishedRun> published_runs();

}  // namespace ht::bench

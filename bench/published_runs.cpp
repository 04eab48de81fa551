#include "bench/published_runs.h"

namespace ht::bench {
namespace {

// Megatron's GPT (Korthikanti et al. 2022: s = 2048, V = 51200, FFN 4h) in our GPT-2 layout.
std::vector<std::string> megatron_gpt(int layers, int heads, int hidden) {
  return {"model.n_layer=" + std::to_string(layers), "model.n_head=" + std::to_string(heads),
          "model.n_embd=" + std::to_string(hidden), "model.vocab_size=51200", "model.block_size=2048"};
}

// MosaicML's MPT (llm-foundry's yamls: expansion 4, vocabulary 50368, s = 2048) in our GPT-2 layout.
std::vector<std::string> mpt(int layers, int heads, int hidden) {
  return {"model.n_layer=" + std::to_string(layers), "model.n_head=" + std::to_string(heads),
          "model.n_embd=" + std::to_string(hidden), "model.vocab_size=50368", "model.block_size=2048"};
}

const char* kKorthikanti =
    "Korthikanti et al. 2022 (arXiv:2205.05198), tables 3 and 5";
const char* kKorthikantiDiffers =
    "Megatron-LM on Selene (A100 80GB, fp16): fused bias+GeLU, softmax and LayerNorm kernels on fp16 activations, "
    "where ours runs them apart on an fp32 residual stream (not priced: ours are); ";
const char* kTitanA100 =
    "torchtitan docs/performance.md at 0413364 (64 A100 80GB, FSDP2, local batch x 64)";
const char* kTitanDiffers =
    "torchtitan (FSDP2, PyTorch's SDPA flash attention, eager); ";
const char* kMosaic = "MosaicML llm-foundry scripts/train/benchmarking/README.md at 061f2c7 (FSDP FULL_SHARD)";
const char* kMosaicDiffers =
    "llm-foundry MPT: no biases, ALiBi rather than learned positions (a few MB of parameters: priced as ours), "
    "Triton flash attention, low-precision LayerNorm; a 12-step throughput run";

PublishedRun korthikanti(const std::string& id, std::vector<std::string> model, int tensor, int stages, int64_t batch,
                         int64_t micro, Recompute recompute, double seconds, double mfu, int virtual_stages,
                         const std::string& differs) {
  PublishedRun r;
  r.id = id;
  r.source = kKorthikanti;
  r.base = "configs/gpt3_175b.toml";
  r.model = std::move(model);
  r.device = "a100-80gb";
  r.nodes = tensor * stages / 8;
  r.tensor = tensor;
  r.stages = stages;
  r.sequence_parallel = recompute == Recompute::kSelective;
  r.global_batch = batch;
  r.micro_batch = micro;
  r.recompute = recompute;
  r.figure = Figure::kIterationSeconds;
  r.value = seconds;
  r.published_mfu = mfu;
  r.fused_optimizer = true;
  r.tp_backward_overlap = true;
  r.half_weights = true;
  r.fused_accumulation = true;
  r.virtual_stages = virtual_stages;
  r.differs = std::string(kKorthikantiDiffers) + differs;
  return r;
}

PublishedRun fsdp(const std::string& id, const char* source, const std::string& base, std::vector<std::string> model,
                  const std::string& device, int gpus, int64_t micro, int64_t accumulation, Recompute recompute,
                  double tokens_per_s, double mfu, const std::string& differs) {
  PublishedRun r;
  r.id = id;
  r.source = source;
  r.base = base;
  r.model = std::move(model);
  r.device = device;
  r.nodes = (gpus + 7) / 8;
  r.per_node = gpus < 8 ? gpus : 8;
  r.data = gpus;
  r.shard = ShardLevel::kParameters;
  r.micro_batch = micro;
  r.global_batch = micro * accumulation * gpus;
  r.recompute = recompute;
  r.figure = Figure::kTokensPerSecondPerGpu;
  r.value = tokens_per_s;
  r.published_mfu = mfu;
  r.half_gathers = true;
  r.half_weights = true;
  r.differs = differs;
  return r;
}

}  // namespace

std::vector<PublishedRun> published_runs() {
  std::vector<PublishedRun> rows;
  // Korthikanti et al. 2022: tensor parallelism 8 on a node, no data parallelism; the "present
  // work" column is selective recomputation with sequence parallelism, the other full
  // recomputation without it. 175B and 530B ran the interleaved schedule with 3 chunks per rank.
  rows.push_back(korthikanti("22B sel+SP", megatron_gpt(48, 64, 6144), 8, 1, 4, 4, Recompute::kSelective, 1.10, 0.415, 1,
                             "selective recomputation recomputes attention's softmax, which our attention op never saves"));
  rows.push_back(korthikanti("22B full", megatron_gpt(48, 64, 6144), 8, 1, 4, 4, Recompute::kFull, 1.42, 0, 1,
                             "full recomputation as ours runs it (memory.policy = \"full\"), its all-reduces repeated"));
  rows.push_back(korthikanti("175B sel+SP", megatron_gpt(96, 96, 12288), 8, 8, 64, 1, Recompute::kSelective, 13.75, 0.514, 3,
                             "the interleaved schedule with 3 chunks per stage, simulated as ours runs it"));
  rows.push_back(korthikanti("175B full", megatron_gpt(96, 96, 12288), 8, 8, 64, 1, Recompute::kFull, 18.13, 0, 3,
                             "interleaved, 3 chunks; full recomputation as ours runs it, its all-reduces repeated"));
  rows.push_back(korthikanti("530B sel+SP", megatron_gpt(105, 128, 20480), 8, 35, 280, 1, Recompute::kSelective, 37.83,
                             0.560, 3, "interleaved, 3 chunks: stages of 3 layers, one per chunk"));
  rows.push_back(korthikanti("1T sel+SP", megatron_gpt(128, 160, 25600), 8, 64, 512, 1, Recompute::kSelective, 71.49,
                             0.563, 1, "stages of 2 layers across 64 nodes: point-to-point messages not modelled"));
  // torchtitan on 64 A100s (the older performance page): FSDP over every GPU, local batch 1 or 2.
  rows.push_back(fsdp("Llama3-8B", kTitanA100, "configs/llama3_8b.toml", {}, "a100-80gb", 64, 1, 1, Recompute::kSelective,
                      2973, 0.582,
                      std::string(kTitanDiffers) + "selective op checkpointing (every block keeps its matmuls' "
                      "outputs but every second one's, and attention's; backward recomputes the rest): priced"));
  rows.back().op_checkpointing = true;
  rows.push_back(fsdp("Llama3-70B", kTitanA100, "configs/llama3_70b.toml", {}, "a100-80gb", 64, 1, 1, Recompute::kFull, 331,
                      0.517, std::string(kTitanDiffers) + "full recomputation as ours runs it (memory.policy = \"full\")"));
  rows.push_back(fsdp("Llama2-13B", kTitanA100, "configs/llama3_8b.toml",
                      {"model.n_layer=40", "model.n_head=40", "model.n_kv_heads=0", "model.n_embd=5120",
                       "model.ffn_dim_multiplier=0", "model.multiple_of=256", "model.vocab_size=32000",
                       "model.block_size=4096", "model.rope_theta=10000"},
                      "a100-80gb", 64, 2, 1, Recompute::kNone, 2162, 0.611, std::string(kTitanDiffers) + "no recomputation"));
  rows.push_back(fsdp("Llama2-70B", kTitanA100, "configs/llama3_70b.toml",
                      {"model.vocab_size=32000", "model.block_size=4096", "model.rope_theta=10000"}, "a100-80gb", 64, 2, 1,
                      Recompute::kFull, 353, 0.505,
                      std::string(kTitanDiffers) + "full recomputation as ours runs it (memory.policy = \"full\")"));
  // MosaicML's MPT throughput tables: FSDP over every GPU, no recomputation.
  rows.push_back(fsdp("MPT-1B H100", kMosaic, "configs/gpt3_175b.toml", mpt(24, 16, 2048), "h100-sxm", 8, 14, 1,
                      Recompute::kNone, 45455, 0.4182, kMosaicDiffers));
  rows.push_back(fsdp("MPT-7B H100", kMosaic, "configs/gpt3_175b.toml", mpt(32, 32, 4096), "h100-sxm", 8, 6, 1,
                      Recompute::kNone, 10643, 0.4644, kMosaicDiffers));
  rows.push_back(fsdp("MPT-13B H100", kMosaic, "configs/gpt3_175b.toml", mpt(40, 40, 5120), "h100-sxm", 64, 2, 1,
                      Recompute::kNone, 4800, 0.3986, kMosaicDiffers));
  rows.push_back(fsdp("MPT-1B A100", kMosaic, "configs/gpt3_175b.toml", mpt(24, 16, 2048), "a100-80gb", 8, 14, 4,
                      Recompute::kNone, 20513, 0.5986, kMosaicDiffers));
  rows.push_back(fsdp("MPT-7B A100", kMosaic, "configs/gpt3_175b.toml", mpt(32, 32, 4096), "a100-80gb", 8, 6, 2,
                      Recompute::kNone, 4641, 0.6423, kMosaicDiffers));
  {
    // BLOOM-176B (BigScience tr11-176B-ml: README and slurm script, log at iteration 85376).
    PublishedRun r;
    r.id = "BLOOM-176B";
    r.source = "bigscience-workshop/bigscience train/tr11-176B-ml (README, slurm script, iteration 85376's log)";
    r.base = "configs/gpt3_175b.toml";
    r.model = {"model.n_layer=70", "model.n_head=112", "model.n_embd=14336", "model.vocab_size=250880",
               "model.block_size=2048"};
    r.device = "a100-80gb";
    r.nodes = 48;
    // Jean Zay's A100 nodes: 4 Omni-Path links of 100 Gb/s (IDRIS's documentation), 50 GB/s a node.
    r.inter_node_gbps = 50.0 / 8;
    r.data = 8;
    r.tensor = 4;
    r.stages = 12;
    r.shard = ShardLevel::kOptimizer;
    r.fused_optimizer = true;
    r.half_weights = true;
    r.casts_gradients = true;
    r.global_batch = 2048;
    r.micro_batch = 2;
    r.recompute = Recompute::kFull;
    r.figure = Figure::kIterationSeconds;
    r.value = 104.70;
    r.differs = "Megatron-DeepSpeed on Jean Zay (4 Omni-Path links a node, not a 200 Gb/s NIC per GPU: set so), "
                "ALiBi and an embedding LayerNorm; DeepSpeed's bf16 optimizer adds each micro-batch's bf16 "
                "gradients into fp32 ones with a cast (ours widens each copy's gradient as it adds: priced)";
    rows.push_back(r);
  }
  return rows;
}

}  // namespace ht::bench

#pragma once
// The job's configuration: one struct per TOML section, with defaults. Every field's type,
// documentation, allowed values and the rules that check it live in one table,
// launcher/config/config_schema.cpp; parsing, overrides, --help, the resolved config and the
// reference page (docs/config-reference.md) are all generated from that table. A closed set of
// choices is an enum (base/choice.h), parsed from its name once, here at the config's boundary.

#include "memory/memory_policy.h"
#include "parallel/pipeline_links.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/shard_layout.h"
#include "parallel/stage_partition.h"
#include "runtime/context_parallel.h"
#include "runtime/mixed_precision.h"
#include "training/optimizer_options.h"

#include <cstdint>
#include <string>
#include <vector>

namespace ht {

enum class ModelKind : uint8_t { kMlp, kConvnet, kResnet, kGpt, kSupernet, kLlama };
template <>
struct ChoiceNames<ModelKind> {
  static constexpr std::pair<ModelKind, const char*> table[] = {
      {ModelKind::kMlp, "mlp"}, {ModelKind::kConvnet, "convnet"}, {ModelKind::kResnet, "resnet"},
      {ModelKind::kGpt, "gpt"}, {ModelKind::kSupernet, "supernet"}, {ModelKind::kLlama, "llama"}};
};
// The decoder-only transformers (models/decoder.h): GPT-2's layout and the Llama family's.
inline bool is_decoder(ModelKind m) { return m == ModelKind::kGpt || m == ModelKind::kLlama; }
// Whether a model takes images (every one but the decoders, which take tokens).
inline bool takes_images(ModelKind m) { return !is_decoder(m); }
enum class DatasetKind : uint8_t { kFashionMnist, kSynthetic, kText, kTokens };
template <>
struct ChoiceNames<DatasetKind> {
  static constexpr std::pair<DatasetKind, const char*> table[] = {
      {DatasetKind::kFashionMnist, "fashion_mnist"}, {DatasetKind::kSynthetic, "synthetic"}, {DatasetKind::kText, "text"},
      {DatasetKind::kTokens, "tokens"}};
};
// data.token_dtype: how token files store a token: as llm.c's header says, or headerless uint16/uint32.
enum class TokenDtype : uint8_t { kHeader, kUint16, kUint32 };
template <>
struct ChoiceNames<TokenDtype> {
  static constexpr std::pair<TokenDtype, const char*> table[] = {
      {TokenDtype::kHeader, "header"}, {TokenDtype::kUint16, "uint16"}, {TokenDtype::kUint32, "uint32"}};
};
// parallel.strategy: train as configured, or as the planner's fastest plan.
enum class Strategy : uint8_t { kManual, kAuto };
template <>
struct ChoiceNames<Strategy> {
  static constexpr std::pair<Strategy, const char*> table[] = {{Strategy::kManual, "manual"}, {Strategy::kAuto, "auto"}};
};

struct JobConfig {
  std::string name = "run";
  int64_t seed = 1;
  std::string output_dir = "runs/run";
};

// Architecture knobs of every model; each applies to the models the schema says.
struct ModelConfig {
  ModelKind name = ModelKind::kMlp;              // required
  std::vector<int64_t> hidden{256, 256};         // mlp
  std::vector<int64_t> channels{32, 64};         // convnet
  int64_t fc_hidden = 128;                       // convnet
  int64_t depth = 18;                            // resnet
  int64_t width = 64;                            // resnet, supernet
  std::vector<int64_t> stage_blocks;             // resnet
  bool small_input = true;                       // resnet
  int64_t n_layer = 6, n_head = 8, n_embd = 256;  // gpt, llama
  int64_t block_size = 128;                      // gpt, llama
  int64_t vocab_size = 0;                        // gpt, llama; 0: the data's
  int64_t n_kv_heads = 0;                        // llama; 0: n_head
  double ffn_dim_multiplier = 0;                 // llama; 0: none
  int64_t multiple_of = 256;                     // llama
  double rope_theta = 10000;                     // llama
  double norm_eps = 1e-5;                        // gpt, llama
  bool tie_embeddings = false;                   // llama (gpt always ties)
  std::string init_from;                         // gpt, llama: a Hugging Face checkpoint to start from
  int64_t num_blocks = 4;                        // supernet
  double dropout = 0.0;                          // mlp, convnet, gpt, llama
};

struct DataConfig {
  DatasetKind dataset = DatasetKind::kFashionMnist;  // required
  std::string path;                          // folder (fashion_mnist), file (text), file or glob (tokens)
  std::string eval_path;                     // tokens: file or glob of the held-out split; empty: the tail
  double eval_fraction = 0.1;                // text, tokens: share held out for evaluation
  TokenDtype token_dtype = TokenDtype::kHeader;  // tokens: llm.c's header, or headerless uint16/uint32
  int64_t vocab_size = 0;                    // tokens: 0: from the header's format
  std::string tokenizer;                     // text: a SentencePiece model; empty: characters
  int64_t synthetic_samples = 4096;
  int64_t synthetic_eval_samples = 1024;
  std::vector<int64_t> synthetic_shape{3, 32, 32};
  int64_t synthetic_classes = 10;            // classes, or vocabulary size for gpt
  bool shuffle = true;
};

struct TrainingConfig {
  std::string device = "cpu";
  int64_t threads = 0;
  bool channels_last = true;  // image models: convolution weights, so activations, NHWC
  int64_t steps = 0;
  int64_t epochs = 1;
  int64_t global_batch_size = 64;
  int64_t micro_batch_size = 0;
  OptimizerKind optimizer = OptimizerKind::kSgd;
  double lr = 0.05;
  double min_lr = 0.0;
  LrSchedule schedule = LrSchedule::kCosine;
  int64_t warmup_steps = 0;
  double momentum = 0.9;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.0;
  double grad_clip = 0.0;
  StateDtype optimizer_state_dtype = StateDtype::kFp32;  // adamw's moments
  int64_t eval_interval = 0;
  int64_t eval_batches = 0;
  MixedPrecision mixed_precision = MixedPrecision::kOff;
  ComputeWeightsMode compute_weights = ComputeWeightsMode::kAuto;
  GradientDtype gradient_dtype = GradientDtype::kAuto;  // bf16 precision (runtime/mixed_precision.h)
  double loss_scale = 65536.0;  // fp16: dynamic loss scaling (training/loss_scaler.h)
  double loss_scale_growth = 2.0;
  double loss_scale_backoff = 0.5;
  int64_t loss_scale_growth_interval = 2000;
};

struct ParallelConfig {
  Strategy strategy = Strategy::kManual;  // auto: plan first (planner/), train with its choice
  int64_t data_parallel = 0;  // 0: every rank of the job (world / (pipeline_parallel x context_parallel x tensor_parallel))
  int64_t pipeline_parallel = 1;
  int64_t tensor_parallel = 1;     // ranks each decoder layer is split across (innermost in the grid)
  int64_t context_parallel = 1;    // ranks each sequence is split across (next to tensor_parallel)
  ContextExchange context_exchange = ContextExchange::kRing;  // how attention's keys and values meet its queries
  bool sequence_parallel = false;  // with tensor_parallel: norms, dropouts and the residual stream in pieces
  ScheduleKind pipeline_schedule = ScheduleKind::k1f1b;
  int64_t virtual_stages = 1;         // interleaved_1f1b: model chunks per rank
  std::vector<int64_t> stage_blocks;  // blocks per stage; empty: balanced by the blocks' times
  StageCosts stage_costs = StageCosts::kMeasured;  // the times: measured (rank 0's probe) or modeled
  PipelineP2p pipeline_p2p = PipelineP2p::kAuto;   // nccl_like: CPU ranks' messages as NCCL carries them
  int64_t bucket_mb = 25;
  bool overlap = true;  // all-reduce buckets on a worker thread while backward runs
  double timeout_s = 300;
  ShardLevel shard = ShardLevel::kNone;  // what the data-parallel ranks split among them (ZeRO)
  int64_t prefetch = 1;  // shard = parameters: blocks whose gathers run ahead, on a communication thread
};

struct MemoryConfig {
  MemoryPolicy policy = MemoryPolicy::kNone;
  std::string budget;
  bool block_offload = false;  // per_block: a block's plan may offload values to host memory too
  std::string block_keep;  // per_block: bytes each block keeps through forward ("12MiB"); empty: the planner's choice
  double eviction_threshold = 0.9;
  bool sqrt_sampling = false;
  bool ignore_small = true;
  bool eviction_window = true;  // a request that finds no block evicts Coop's cheapest window
  KernelCosts kernel_costs = KernelCosts::kModeled;  // what eviction weighs: modeled (deterministic) or measured
  double solve_time_s = 10;   // static plans: the solver's time limit per plan
  bool static_layout = true;  // static plans: blocks at planned offsets
  bool plan_first_step = true;  // static plans: the first step planned from a trace on meta tensors
  bool trace = false;
  int64_t trace_steps = 2;
  bool host_cache = true;  // keep freed CPU memory for reuse (alloc/host_block_cache.h)
  bool check_fit = true;   // refuse a run the planner predicts cannot fit (launcher/planning/run_check.h)
  // Host swap (policies swap and hybrid): host memory for copies, and the link's modelled rate.
  std::string host_budget;        // empty: half of the host's available memory
  double host_link_gbps = 25;     // PCIe Gen4 x16 in practice, per direction
  Compression compress = Compression::kOff;
  StatePlace optimizer_state = StatePlace::kDevice;  // host: waits on host between optimizer steps
};

// Machines not at hand, for the planner: without it, `hybrid_train plan` measures this one.
struct ClusterConfig {
  int64_t nodes = 0;  // 0: no cluster described
  // A kind of the device catalog (configs/devices.toml): the plan is made from a step traced on
  // meta tensors, priced at that kind's rates (launcher/planning/trace_profile.h); "": profiled
  // here, scaled by device_speed.
  std::string device;
  int64_t devices_per_node = 8;
  std::string device_memory = "80GiB";
  // Host memory of one node ("2TiB"); "": not described, so the search offers no offload to host.
  std::string host_memory;
  double intra_node_gbps = 150;  // NVLink-class, per direction, as all-reduce sees it
  double inter_node_gbps = 25;   // 200 Gb/s InfiniBand
  double intra_node_latency_us = 10;
  double inter_node_latency_us = 20;
  double device_speed = 1.0;  // compute relative to the device `plan` profiles on
  // Device memory a rank's process holds outside its tensors (planner/machine.h): the CUDA
  // context with libtorch's kernels, handles and workspaces, and each NCCL communicator's buffers.
  double runtime_mib = 1024;
  double communicator_mib = 700;
  int64_t device_memory_bytes = 0;  // derived from device_memory by validation
  int64_t host_memory_bytes = 0;    // derived from host_memory by validation (0: not described)
};

struct CheckpointConfig {
  int64_t interval = 0;
  int64_t keep = 3;
  bool async = false;
  std::string resume;
  std::string dir;
};

struct MetricsConfig {
  int64_t log_interval = 10;
  bool time_by_op = false;
};

struct Config {
  JobConfig job;
  ModelConfig model;
  DataConfig data;
  TrainingConfig training;
  ParallelConfig parallel;
  MemoryConfig memory;
  ClusterConfig cluster;
  CheckpointConfig checkpoint;
  MetricsConfig metrics;

  // Not read from the file.
  std::string source;  // the config file's path
  // What the keys say, as the user wrote them: the replicas, micro-batches and budget's bytes a
  // rank trains with are the resolved plan's (launcher/config/run_plan_of.h), never stored here.
  std::string checkpoint_dir() const {
    return checkpoint.dir.empty() ? job.output_dir + "/checkpoints" : checkpoint.dir;
  }
};

}  // namespace ht

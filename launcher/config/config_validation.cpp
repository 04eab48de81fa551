#include "launcher/config/config_validation.h"

#include "memory/memory_policy.h"
#include "parallel/pipeline_schedule.h"

#include "launcher/config/config_schema.h"
#include "launcher/config/run_plan_of.h"
#include "launcher/data/fashion_mnist.h"
#include "launcher/model_factory.h"
#include "base/user_error.h"
#include "alloc/byte_size.h"
#include "alloc/cuda_arena.h"

#include <ATen/Context.h>

#include <algorithm>
#include <regex>

namespace ht {
namespace {

class Rules {
 public:
  Rules(Config& c, const std::map<std::string, std::string>& where) : c_(c), where_(where) {}

  // "file:line:col: " of a key if the user set it, else the config file.
  std::string loc(const std::string& path) const {
    auto it = where_.find(path);
    return (it != where_.end() ? it->second : c_.source) + ": ";
  }
  bool is_set(const std::string& path) const { return where_.count(path) != 0; }

  void features_not_built() const {
    const Config defaults;
    for (const FieldSpec& f : config_schema()) {
      if (f.not_built.empty() || f.get(c_) == f.get(defaults)) continue;
      throw UserError(loc(f.path()) + f.path() + " = " + to_toml(f.get(c_)) + ": " + f.not_built +
                      " is not built yet; remove the key or use " + to_toml(f.get(defaults)));
    }
  }

  void batch_sizes() const {
    const auto& t = c_.training;
    if (t.micro_batch_size > 0 && t.global_batch_size % t.micro_batch_size != 0) {
      std::string divisors;
      for (int64_t d = 1; d <= t.global_batch_size; ++d)
        if (t.global_batch_size % d == 0 && d < t.global_batch_size) divisors = std::to_string(d);
      throw UserError(loc("training.micro_batch_size") + "training.global_batch_size = " +
                      std::to_string(t.global_batch_size) + " is not a multiple of training.micro_batch_size = " +
                      std::to_string(t.micro_batch_size) + "; use a divisor of the global batch (e.g. " + divisors +
                      ") or 0 for no accumulation");
    }
  }

  void device() const {
    static const std::regex pattern("cpu|cuda(:[0-9]+)?");
    const std::string& d = c_.training.device;
    if (!std::regex_match(d, pattern)) {
      throw UserError(loc("training.device") + "training.device = \"" + d +
                      "\" is not a device; use \"cpu\", \"cuda\" or \"cuda:N\"");
    }
    if (d != "cpu" && !at::hasCUDA()) {
      throw UserError(loc("training.device") + "training.device = \"" + d +
                      "\" but this build's libtorch has no CUDA or no GPU is visible; use \"cpu\"");
    }
  }

  void mixed_precision() const {
    if (c_.training.mixed_precision == MixedPrecision::kFp16 && c_.training.device == "cpu") {
      throw UserError(loc("training.mixed_precision") + "training.mixed_precision = \"fp16\" on training.device = "
                      "\"cpu\": ATen lacks most fp16 CPU kernels; use \"bf16\" on the CPU, or fp16 with "
                      "training.device = \"cuda\"");
    }
  }

  // A static plan is solved over the first step, whose casts the kept copies then replace.
  // (Under ZeRO-3 the copies are the shards', gathered where read: nothing is kept whole.)
  void compute_weights() const {
    if (c_.training.compute_weights != ComputeWeightsMode::kKept) return;
    const std::string head = loc("training.compute_weights") + "training.compute_weights = \"kept\"";
    if (plans_statically(c_.memory.policy)) {
      throw UserError(head + " with memory.policy = \"" + choice_name(c_.memory.policy) +
                      "\": a static plan places the tensors of the first step, whose weight casts the kept copies "
                      "replace from the second on; use training.compute_weights = \"cast\" (or \"auto\"), or "
                      "memory.policy = \"dtr\"");
    }
  }

  void learning_rate() const {
    if (c_.training.min_lr > c_.training.lr) {
      throw UserError(loc("training.min_lr") + "training.min_lr = " + to_toml(c_.training.min_lr) +
                      " exceeds training.lr = " + to_toml(c_.training.lr) + "; use a min_lr <= lr");
    }
  }

  void model_shape() const {
    const auto& m = c_.model;
    if (m.name == ModelKind::kResnet && m.depth != 18 && m.depth != 34 && m.depth != 50) {
      throw UserError(loc("model.depth") + "model.depth = " + std::to_string(m.depth) + ": use 18, 34 or 50");
    }
    if (is_decoder(m.name)) {
      DecoderOptions o = decoder_options(m, std::max<int64_t>(m.vocab_size, 1));
      o.tensor_parallel = c_.parallel.tensor_parallel;
      o.sequence_parallel = c_.parallel.sequence_parallel;
      o.context_parallel = c_.parallel.context_parallel;
      const DecoderOptions::Diagnosis problem = o.diagnose();
      if (problem.message.empty()) return;
      // Where the first key the message names was set (the file's line or the command line's
      // argument); a key left at its default points at the next.
      for (const std::string& key : problem.keys) {
        if (is_set(key)) throw UserError(loc(key) + problem.message);
      }
      throw UserError(c_.source + ": " + problem.message);
    }
  }

  // What tensor parallelism splits, and what it does not compose with yet.
  void tensor_parallel() const {
    const ParallelConfig& p = c_.parallel;
    if (p.tensor_parallel == 1) return;
    const std::string head = loc("parallel.tensor_parallel") + "parallel.tensor_parallel = " + std::to_string(p.tensor_parallel);
    if (!is_decoder(c_.model.name)) {
      throw UserError(head + " with model.name = \"" + choice_name(c_.model.name) +
                      "\": only the transformers (gpt, llama) have layers built to split across ranks (heads, MLP "
                      "width, vocabulary); a convolution network's channels and a supernet's changing paths are not; "
                      "use parallel.data_parallel or parallel.pipeline_parallel for this model");
    }
  }

  // What context parallelism splits.
  void context_parallel() const {
    const ParallelConfig& p = c_.parallel;
    if (p.context_parallel == 1) return;
    const std::string head = loc("parallel.context_parallel") + "parallel.context_parallel = " + std::to_string(p.context_parallel);
    if (!is_decoder(c_.model.name)) {
      throw UserError(head + " with model.name = \"" + choice_name(c_.model.name) +
                      "\": only the transformers (gpt, llama) train on sequences to split; use parallel.data_parallel "
                      "for this model");
    }
  }

  void model_and_data() {
    auto& d = c_.data;
    const bool tokens = !takes_images(c_.model.name);
    if (tokens && d.dataset == DatasetKind::kFashionMnist) {
      throw UserError(loc("data.dataset") + "model.name = \"" + std::string(choice_name(c_.model.name)) + "\" trains on tokens: use data.dataset = \"text\" "
                      "or \"synthetic\", not \"fashion_mnist\"");
    }
    if (!tokens && (d.dataset == DatasetKind::kText || d.dataset == DatasetKind::kTokens)) {
      throw UserError(loc("data.dataset") + "data.dataset = \"" + choice_name(d.dataset) + "\" gives tokens, which only the decoders (model.name = \"gpt\" or \"llama\") "
                      "take; use \"fashion_mnist\" or \"synthetic\" for " + choice_name(c_.model.name));
    }
    if (d.dataset == DatasetKind::kFashionMnist && d.path.empty()) d.path = kDefaultFashionMnistDir;
    if (d.dataset == DatasetKind::kTokens) token_files();
    if (d.dataset == DatasetKind::kText && d.path.empty()) {
      throw UserError(loc("data.dataset") + "data.path is required with data.dataset = \"text\": a text file, e.g. "
                      "\"/usr/share/common-licenses/GPL-3\"");
    }
    if (!tokens && d.dataset == DatasetKind::kSynthetic && c_.model.name != ModelKind::kMlp && d.synthetic_shape.size() != 3) {
      throw UserError(loc("data.synthetic_shape") + "model.name = \"" + choice_name(c_.model.name) +
                      "\" takes images: data.synthetic_shape must be [channels, height, width]");
    }
  }

  void token_files() const {
    const auto& d = c_.data;
    if (d.path.empty()) {
      throw UserError(loc("data.dataset") + "data.path is required with data.dataset = \"tokens\": a token file or a "
                      "glob of shards, e.g. \"data/fineweb_train_*.bin\" (hybrid_train tokenize writes them from text)");
    }
    if (d.token_dtype != TokenDtype::kHeader && d.vocab_size == 0) {
      throw UserError(loc("data.token_dtype") + "data.token_dtype = \"" + choice_name(d.token_dtype) + "\" reads "
                      "headerless files, which do not say their vocabulary; set data.vocab_size too (e.g. 50257 for "
                      "GPT-2's tokens)");
    }
  }

  // memory.block_keep: one value for every block, or one share per pipeline stage ("25%,75%").
  void block_keep() {
    const std::string& keep = c_.memory.block_keep;
    const std::vector<std::string> entries = block_keep_entries(keep);
    for (const std::string& e : entries) {
      const bool share = e.find('%') != std::string::npos;
      const auto bytes = parse_byte_size(e, 1'000'000'000);
      const bool stage_share = entries.size() > 1 && stage_share_of(e).has_value();
      if (entries.size() > 1 ? !stage_share : !keeps_none(e) && (!bytes || (share && *bytes > 1'000'000'000))) {
        throw UserError(loc("memory.block_keep") + "memory.block_keep = \"" + keep + "\" is not a memory size "
                        "or a share; use bytes with a unit (\"12MiB\", \"800KB\") or a share of what each block's "
                        "backward reads (\"40%\"), or one share per pipeline stage, \"0%\" to \"100%\" (\"25%,75%\"); "
                        "leave it out for the planner's choice");
      }
    }
    const int64_t stages = c_.parallel.pipeline_parallel;
    if (entries.size() > 1 && static_cast<int64_t>(entries.size()) != stages) {
      throw UserError(loc("memory.block_keep") + "memory.block_keep = \"" + keep + "\" names " +
                      std::to_string(entries.size()) + " shares, one per pipeline stage, and " +
                      "parallel.pipeline_parallel = " + std::to_string(stages) + "; give " + std::to_string(stages) +
                      (stages == 1 ? " share" : " shares, the first stage's first") + ", or one for every stage");
    }
  }

  void memory_budget() {
    auto& m = c_.memory;
    if (!m.budget.empty()) {
      const bool gpu = c_.training.device != "cpu";
      // The GPU is asked only for a share: no rank should touch another's GPU before choosing its own.
      const bool share = m.budget.find('%') != std::string::npos;
      const int64_t device_bytes = !gpu ? host_physical_memory_bytes() : share ? cuda_device_memory_bytes(gpu_index()) : -1;
      const auto bytes = parse_byte_size(m.budget, std::max<int64_t>(device_bytes, 0));
      if (!bytes) {
        throw UserError(loc("memory.budget") + "memory.budget = \"" + m.budget + "\" is not a memory size; use "
                        "bytes with a unit (\"1.5GiB\", \"800MiB\", \"2GB\") or a share of the device (\"60%\")");
      }
      budget_bytes_ = *bytes;
      if (gpu) gpu_budget(device_bytes);
    }
    // A budget alone trains the planner's fastest policy at it (run_check.h), where the planner
    // predicts the run: one CPU rank's step, without stages or tensor-parallel groups, and
    // nothing set that needs one policy in particular.
    const ParallelConfig& p = c_.parallel;
    if (!m.budget.empty() && !is_set("memory.policy") && c_.training.device == "cpu" &&
        p.strategy != Strategy::kAuto && p.pipeline_parallel == 1 && p.tensor_parallel == 1 && p.context_parallel == 1 &&
        (p.shard == ShardLevel::kNone || p.shard == ShardLevel::kOptimizer) &&
        m.optimizer_state == StatePlace::kDevice && m.compress != Compression::kBf16) {
      m.policy = MemoryPolicy::kAuto;
    }
    const std::string policy = choice_name(m.policy);
    // auto may choose hybrid
    if (uses_host_link(m.policy, m.block_offload) || m.policy == MemoryPolicy::kAuto) host_budget();
    if (m.policy == MemoryPolicy::kPerBlock && !m.block_keep.empty()) block_keep();
    if (m.compress == Compression::kBf16 && !swaps(m.policy)) {
      throw UserError(loc("memory.compress") + "memory.compress = \"bf16\" shrinks what crosses the host link, and "
                      "memory.policy = \"" + policy + "\" swaps nothing; set memory.policy = \"swap\" or \"hybrid\" "
                      "(with memory.budget), or memory.compress = \"lossless\"");
    }
    if (m.optimizer_state == StatePlace::kHost && !swaps(m.policy)) {
      throw UserError(loc("memory.optimizer_state") + "memory.optimizer_state = \"host\" moves the optimizer state over "
                      "the host link, which memory.policy = \"" + policy + "\" does not open; set memory.policy = "
                      "\"swap\" or \"hybrid\" (with memory.budget), or memory.optimizer_state = \"device\"");
    }
    if (evicts(m.policy) && m.budget.empty()) {
      throw UserError(loc("memory.policy") + "memory.policy = \"" + policy + "\" evicts to fit a budget, and "
                      "memory.budget is not set; set it too, e.g. memory.budget = \"2GiB\" or \"50%\"");
    }
  }

  // A budget on a GPU is an arena over one cudaMalloc block (alloc/cuda_arena.h).
  void gpu_budget(int64_t device_bytes) const {
    const auto& m = c_.memory;
    const std::string head = "memory.budget on training.device = \"" + c_.training.device + "\": ";
    if (!cuda_budgets_built()) {
      throw UserError(loc("memory.budget") + head + cuda_budgets_missing() + "; remove memory.budget or train on \"cpu\"");
    }
    if (m.budget.find('%') != std::string::npos && device_bytes <= 0) {
      throw UserError(loc("memory.budget") + head + "cannot read the GPU's memory size for a share; give bytes, "
                      "e.g. \"20GiB\"");
    }
    if (device_bytes > 0 && budget_bytes_ > device_bytes) {
      throw UserError(loc("memory.budget") + head + format_bytes(budget_bytes_) + " is more than the GPU's " +
                      format_bytes(device_bytes) + "; use at most that, e.g. \"90%\"");
    }
  }
  int gpu_index() const {
    const std::string& d = c_.training.device;
    return d.size() > 5 ? std::stoi(d.substr(5)) : 0;  // "cuda": the local rank's, alike on a node
  }

  void host_budget() {
    auto& m = c_.memory;
    const int64_t available = host_available_memory_bytes();
    if (m.host_budget.empty()) return;  // half of it
    const auto bytes = parse_byte_size(m.host_budget, available);
    if (!bytes) {
      throw UserError(loc("memory.host_budget") + "memory.host_budget = \"" + m.host_budget +
                      "\" is not a memory size; use bytes with a unit (\"8GiB\", \"500MB\") or a share of the host's "
                      "available memory (\"50%\")");
    }
    if (*bytes > available) {
      throw UserError(loc("memory.host_budget") + "memory.host_budget = \"" + m.host_budget + "\" (" +
                      format_bytes(*bytes) + ") is more than this host's available memory (" + format_bytes(available) +
                      "); use at most that, e.g. \"50%\"");
    }
  }

  void sharding() const {
    const ParallelConfig& p = c_.parallel;
    if (p.shard == ShardLevel::kNone) return;
    const std::string head = loc("parallel.shard") + "parallel.shard = \"" + choice_name(p.shard) + "\"";
    if (p.shard == ShardLevel::kParameters) parameter_sharding(head);
    if (p.shard == ShardLevel::kGradients && p.pipeline_parallel > 1) {
      // A stage's point-to-point messages hold MPI while its backward runs, and its gradients are
      // reduced once, after the step's last backward; ZeRO-2 reduce-scatters every micro-batch's
      // buckets as backward finishes them.
      throw UserError(head + " with parallel.pipeline_parallel = " + std::to_string(p.pipeline_parallel) +
                      ": sharded gradients are reduce-scattered during every micro-batch's backward, while a "
                      "stage's point-to-point messages hold MPI (as DeepSpeed refuses ZeRO-2 with pipelines); use "
                      "parallel.shard = \"optimizer\" with stages, or no stages");
    }
    if (p.shard == ShardLevel::kGradients && plans_statically(c_.memory.policy)) {
      throw UserError(head + " with memory.policy = \"" + choice_name(c_.memory.policy) +
                      "\": a static plan places every tensor of a captured step, and sharded gradients make each "
                      "bucket's block outside the ops it captures; use memory.policy = \"dtr\" (or \"none\"), or "
                      "parallel.shard = \"optimizer\"");
    }
  }

  // ZeRO-3 gathers a bucket's parameters where a kernel first reads one: every rank must read at
  // the same points, so whatever decides what is resident must decide the same on every rank.
  void parameter_sharding(const std::string& head) const {
    const ParallelConfig& p = c_.parallel;
    const MemoryConfig& m = c_.memory;
    if (p.pipeline_parallel > 1) {
      throw UserError(head + " with parallel.pipeline_parallel = " + std::to_string(p.pipeline_parallel) +
                      ": a stage's parameters would be gathered while its point-to-point messages hold MPI (as "
                      "DeepSpeed refuses ZeRO-3 with pipelines); use parallel.shard = \"optimizer\" with stages, "
                      "or no stages");
    }
    if (plans_statically(m.policy) || uses_host_link(m.policy, m.block_offload)) {
      throw UserError(head + " with memory.policy = \"" + choice_name(m.policy) + "\"" +
                      (m.policy == MemoryPolicy::kPerBlock && m.block_offload ? " and memory.block_offload = true" : "") +
                      ": " +
                      (uses_host_link(m.policy, m.block_offload) ? "host swap decides by when copies finish, which differs between ranks, and "
                                         "a parameter gather must happen at the same point on every rank"
                                       : "a static plan places every tensor of a captured step, and gathered "
                                         "parameters are made outside the ops it captures") +
                      "; use memory.policy = \"dtr\" (or \"none\"), or parallel.shard = \"gradients\"");
    }
    if (m.kernel_costs == KernelCosts::kMeasured && evicts(m.policy) && budget_bytes_ != 0) {
      throw UserError(head + " with memory.kernel_costs = \"measured\": measured times differ between ranks, so "
                      "their evictions, and the parameter gathers that recomputations need, would too; use "
                      "memory.kernel_costs = \"modeled\"");
    }
    if (p.context_parallel > 1 && evicts(m.policy) && budget_bytes_ != 0) {
      throw UserError(head + " with parallel.context_parallel = " + std::to_string(p.context_parallel) +
                      " and memory.policy = \"" + choice_name(m.policy) + "\": the ranks of a context group hold "
                      "other chunks of each sequence, whose causal attention makes blocks of other sizes, so their "
                      "evictions, and the parameter gathers that recomputations need, differ; use parallel.shard = "
                      "\"gradients\" (or \"optimizer\"), or memory.policy = \"none\"");
    }
  }

  void cluster_memory() {
    auto& k = c_.cluster;
    if (k.nodes == 0) return;
    const auto bytes = parse_byte_size(k.device_memory, 0);
    if (!bytes || *bytes <= 0) {
      throw UserError(loc("cluster.device_memory") + "cluster.device_memory = \"" + k.device_memory +
                      "\" is not a memory size; use bytes with a unit, e.g. \"80GiB\" or \"16GB\"");
    }
    k.device_memory_bytes = *bytes;
    if (k.host_memory.empty()) return;
    const auto host = parse_byte_size(k.host_memory, 0);
    if (!host || *host <= 0) {
      throw UserError(loc("cluster.host_memory") + "cluster.host_memory = \"" + k.host_memory +
                      "\" is not a memory size; use bytes with a unit, e.g. \"2TiB\", or \"\" for none described");
    }
    k.host_memory_bytes = *host;
  }

  std::vector<std::string> ineffective_options() const {
    std::vector<std::string> warnings;
    for (const FieldSpec& f : config_schema()) {
      if (!f.applies || !is_set(f.path()) || f.applies(c_)) continue;
      warnings.push_back(loc(f.path()) + f.path() + " has no effect: it applies only when " + f.applies_when);
    }
    return warnings;
  }

 private:
  Config& c_;
  int64_t budget_bytes_ = 0;  // memory.budget's bytes, once memory_budget() has read them
  const std::map<std::string, std::string>& where_;
};

}  // namespace

std::vector<std::string> validate_config(Config& config, const std::map<std::string, std::string>& where) {
  Rules rules(config, where);
  rules.features_not_built();
  rules.batch_sizes();
  rules.device();
  rules.mixed_precision();
  rules.learning_rate();
  rules.model_shape();
  rules.model_and_data();
  rules.memory_budget();
  rules.compute_weights();  // after memory_budget(): a budget alone sets memory.policy = "auto" (static plans)
  rules.cluster_memory();
  rules.sharding();
  rules.tensor_parallel();
  rules.context_parallel();
  return rules.ineffective_options();
}

void check_pipeline_ranks(const Config& c, int64_t world) {
  const int64_t pp = c.parallel.pipeline_parallel, tp = c.parallel.tensor_parallel, cp = c.parallel.context_parallel;
  if (cp > 1 && world % (pp * tp * cp) != 0) {
    throw UserError(c.source + ": parallel.context_parallel = " + std::to_string(cp) + " x parallel.tensor_parallel = " +
                    std::to_string(tp) + " x parallel.pipeline_parallel = " + std::to_string(pp) + " ranks per replica, " +
                    "but the job has " + std::to_string(world) + " rank(s); start it with mpirun -np " +
                    std::to_string(pp * tp * cp) + " (or a multiple: data_parallel x context_parallel x tensor_parallel x "
                    "pipeline_parallel ranks)");
  }
  if (world % (pp * tp) == 0) return;
  if (tp == 1) {
    throw UserError(c.source + ": parallel.pipeline_parallel = " + std::to_string(pp) + " stages, but the job has " +
                    std::to_string(world) + " rank(s); start it with mpirun -np " + std::to_string(pp) +
                    " (or a multiple: data_parallel x pipeline_parallel ranks), or set parallel.pipeline_parallel = 1");
  }
  throw UserError(c.source + ": parallel.tensor_parallel = " + std::to_string(tp) + " x parallel.pipeline_parallel = " +
                  std::to_string(pp) + " ranks per replica, but the job has " + std::to_string(world) +
                  " rank(s); start it with mpirun -np " + std::to_string(pp * tp) +
                  " (or a multiple: data_parallel x tensor_parallel x pipeline_parallel ranks)");
}

}  // namespace ht

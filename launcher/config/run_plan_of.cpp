#include "launcher/config/run_plan_of.h"

#include "alloc/byte_size.h"
#include "alloc/cuda_arena.h"
#include "base/user_error.h"
#include "launcher/device_group.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <tuple>

namespace ht {
namespace {

// The job's replicas against parallel.data_parallel, and the global batch divided among them and
// into micro-batches.
void check_replicas(const Config& c, int64_t replicas) {
  const std::string where = c.source + ": ";
  if (c.parallel.data_parallel != 0 && c.parallel.data_parallel != replicas) {
    // Each replica's ranks: its tensor-parallel groups, context ranks and stages.
    const int64_t per_replica = c.parallel.tensor_parallel * c.parallel.context_parallel * c.parallel.pipeline_parallel;
    throw UserError(where + "parallel.data_parallel = " + std::to_string(c.parallel.data_parallel) + " but the job has " +
                    std::to_string(replicas) + " data-parallel replica(s); start it with mpirun -np " +
                    std::to_string(c.parallel.data_parallel * per_replica) +
                    ", or set parallel.data_parallel = 0 (all ranks)");
  }
  const int64_t global = c.training.global_batch_size;
  if (global % replicas != 0) {
    throw UserError(where + "training.global_batch_size = " + std::to_string(global) + " does not divide among " +
                    std::to_string(replicas) + " data-parallel ranks; use a multiple of " + std::to_string(replicas) +
                    " (e.g. " + std::to_string((global / replicas + 1) * replicas) + ")");
  }
  const int64_t local = global / replicas, micro = c.training.micro_batch_size;
  if (micro > 0 && local % micro != 0) {
    throw UserError(where + "training.micro_batch_size = " + std::to_string(micro) + " does not divide the " +
                    std::to_string(local) + " samples each of the " + std::to_string(replicas) +
                    " ranks trains per step (global_batch_size / ranks); use a divisor of " + std::to_string(local) +
                    " or 0");
  }
}

// With the micro-batch count known: what a pipeline's schedule and memory policy can use.
void check_pipeline(const Config& c, const BatchPlan& batch) {
  const ParallelConfig& p = c.parallel;
  const std::string where = c.source + ": ";
  if (p.pipeline_parallel == 1) return;
  const ScheduleShape shape{static_cast<int>(p.pipeline_parallel), static_cast<int>(batch.micro_batches),
                            static_cast<int>(p.virtual_stages)};
  const std::string why = schedule_refusal(p.pipeline_schedule, shape);
  if (!why.empty()) {
    throw UserError(where + "parallel.pipeline_schedule = \"" + choice_name(p.pipeline_schedule) + "\" with " +
                    std::to_string(shape.micro_batches) + " micro-batches per step (training.micro_batch_size = " +
                    std::to_string(batch.micro) + "): " + why);
  }
  if (plans_statically(c.memory.policy)) {
    throw UserError(where + "memory.policy = \"" + choice_name(c.memory.policy) + "\" with parallel.pipeline_parallel = " +
                    std::to_string(p.pipeline_parallel) + ": static plans capture one micro-batch's step, and a "
                    "pipeline stage interleaves several; use memory.policy = \"dtr\" (or another eviction "
                    "policy) on each stage");
  }
  if (p.strategy == Strategy::kAuto) {
    throw UserError(where + "parallel.strategy = \"auto\" with parallel.pipeline_parallel = " +
                    std::to_string(p.pipeline_parallel) + ": the planner does not search pipeline stages yet; "
                    "use parallel.strategy = \"manual\"");
  }
  if (c.model.name == ModelKind::kSupernet) {
    throw UserError(where + "model.name = \"supernet\" with parallel.pipeline_parallel > 1: a supernet's path "
                    "changes every step, and a stage's activations must keep one shape; use pipeline_parallel = 1");
  }
}

MemoryPlan memory_plan_of(const Config& c) {
  const MemoryConfig& m = c.memory;
  MemoryPlan p;
  p.budget_bytes = budget_bytes_of(c);
  p.policy = m.policy;
  std::tie(p.block_keep_bytes, p.block_keep_share) = block_keep_of(c);
  p.stage_block_keep = stage_block_keep_of(c);
  p.block_offload = m.policy == MemoryPolicy::kPerBlock && m.block_offload;
  p.eviction_threshold = m.eviction_threshold;
  p.sqrt_sampling = m.sqrt_sampling;
  p.ignore_small = m.ignore_small;
  p.eviction_window = m.eviction_window;
  p.kernel_costs = m.kernel_costs;
  p.solve_time_s = m.solve_time_s;
  p.static_layout = m.static_layout;
  p.plan_first_step = m.plan_first_step;
  p.host_budget_bytes = host_budget_bytes_of(c);
  p.host_link_gbps = m.host_link_gbps;
  p.compress = m.compress;
  p.optimizer_state = m.optimizer_state;
  p.host_cache = m.host_cache;
  p.trace = m.trace;
  p.trace_steps = m.trace_steps;
  return p;
}

}  // namespace

OptimizerOptions optimizer_options_of(const TrainingConfig& t) {
  OptimizerOptions o;
  o.kind = t.optimizer;
  o.lr = t.lr;
  o.min_lr = t.min_lr;
  o.schedule = t.schedule;
  o.warmup_steps = t.warmup_steps;
  o.momentum = t.momentum;
  o.beta1 = t.beta1;
  o.beta2 = t.beta2;
  o.eps = t.eps;
  o.weight_decay = t.weight_decay;
  o.grad_clip = t.grad_clip;
  o.state_dtype = t.optimizer_state_dtype;
  return o;
}

namespace {

LoopPlan loop_of(const Config& c) {
  LoopPlan l;
  const TrainingConfig& t = c.training;
  l.steps = t.steps;
  l.epochs = t.epochs;
  l.shuffle = c.data.shuffle;
  l.eval_interval = t.eval_interval;
  // eval_batches counts batches of one rank of a single-rank run.
  l.eval_samples = t.eval_batches * (t.micro_batch_size > 0 ? t.micro_batch_size : t.global_batch_size);
  l.log_interval = c.metrics.log_interval;
  l.time_by_op = c.metrics.time_by_op;
  l.checkpoint_interval = c.checkpoint.interval;
  l.checkpoint_keep = c.checkpoint.keep;
  l.checkpoint_async = c.checkpoint.async;
  l.checkpoint_dir = c.checkpoint_dir();
  l.output_dir = c.job.output_dir;
  return l;
}

}  // namespace

int64_t configured_micro_batch(const Config& c) {
  if (c.training.micro_batch_size > 0) return c.training.micro_batch_size;
  return c.training.global_batch_size / std::max<int64_t>(1, c.parallel.data_parallel);
}

int64_t budget_bytes_of(const Config& c) {
  const std::string& budget = c.memory.budget;
  if (budget.empty()) return 0;
  const std::string& device = c.training.device;
  const bool gpu = device != "cpu";
  // The GPU is asked only for a share: no rank should touch another's GPU before choosing its own.
  const bool share = budget.find('%') != std::string::npos;
  const int index = device.size() > 5 ? std::stoi(device.substr(5)) : 0;
  const int64_t device_bytes = !gpu ? host_physical_memory_bytes() : share ? cuda_device_memory_bytes(index) : -1;
  const auto bytes = parse_byte_size(budget, std::max<int64_t>(device_bytes, 0));
  if (!bytes) {
    throw UserError(c.source + ": memory.budget = \"" + budget + "\" is not a memory size; use bytes with a unit "
                    "(\"1.5GiB\", \"800MiB\", \"2GB\") or a share of the device (\"60%\")");
  }
  return *bytes;
}

namespace {

// One entry of memory.block_keep: bytes, or a share ({0, share}).
std::pair<int64_t, double> block_keep_entry(const Config& c, const std::string& entry) {
  // A share is parsed against a whole of 1e9 bytes: "40%" is 4e8 of it.
  constexpr int64_t kWhole = 1'000'000'000;
  const auto bytes = parse_byte_size(entry, kWhole);
  if (!bytes || (entry.find('%') != std::string::npos && *bytes > kWhole)) {
    throw UserError(c.source + ": memory.block_keep = \"" + c.memory.block_keep + "\" is not a memory size or a share; "
                    "use bytes with a unit (\"12MiB\", \"800KB\") or a share of what each block's backward reads "
                    "(\"40%\"), or one share per pipeline stage (\"25%,75%\")");
  }
  if (entry.find('%') != std::string::npos) return {0, static_cast<double>(*bytes) / kWhole};
  return {*bytes, 0.0};
}

}  // namespace

std::vector<std::string> block_keep_entries(const std::string& keep) {
  std::vector<std::string> entries;
  size_t from = 0;
  while (true) {
    const size_t comma = keep.find(',', from);
    std::string e = keep.substr(from, comma == std::string::npos ? std::string::npos : comma - from);
    const size_t a = e.find_first_not_of(' '), b = e.find_last_not_of(' ');
    entries.push_back(a == std::string::npos ? std::string() : e.substr(a, b - a + 1));
    if (comma == std::string::npos) return entries;
    from = comma + 1;
  }
}

std::pair<int64_t, double> block_keep_of(const Config& c) {
  const std::string& keep = c.memory.block_keep;
  if (keep.empty() || c.memory.policy != MemoryPolicy::kPerBlock) return {0, 0.0};
  if (block_keep_entries(keep).size() > 1) return {0, 0.0};  // a stage's own (stage_block_keep_of)
  if (keeps_none(keep)) return {0, 0.0};                     // every stage's 0% (stage_block_keep_of)
  return block_keep_entry(c, keep);
}

bool keeps_none(const std::string& entry) {
  return entry == "0" || stage_share_of(entry) == std::optional<double>(0.0);
}

std::optional<double> stage_share_of(const std::string& entry) {
  const char* begin = entry.c_str();
  char* end = nullptr;
  const double percent = std::strtod(begin, &end);
  if (end == begin || std::string(end) != "%" || !(percent >= 0 && percent <= 100)) return std::nullopt;
  return percent / 100;
}

std::vector<double> stage_block_keep_of(const Config& c) {
  const std::string& keep = c.memory.block_keep;
  if (keep.empty() || c.memory.policy != MemoryPolicy::kPerBlock) return {};
  const std::vector<std::string> entries = block_keep_entries(keep);
  // "0%": every block keeps nothing on the device (full recomputation, or with
  // memory.block_offload, what its plan offloads), every stage's share.
  if (entries.size() == 1 && keeps_none(entries[0])) return std::vector<double>(std::max<int64_t>(1, c.parallel.pipeline_parallel), 0.0);
  if (entries.size() < 2) return {};
  std::vector<double> shares;
  for (const std::string& e : entries) {
    const std::optional<double> share = stage_share_of(e);
    if (!share) {
      throw UserError(c.source + ": memory.block_keep = \"" + keep + "\": each pipeline stage's entry is a share "
                      "from \"0%\" (its full recomputation) to \"100%\" (\"25%,75%\"); use shares, or one value "
                      "for every stage");
    }
    shares.push_back(*share);
  }
  return shares;
}

int64_t host_budget_bytes_of(const Config& c) {
  const MemoryConfig& m = c.memory;
  if (!uses_host_link(m.policy, m.block_offload) && m.policy != MemoryPolicy::kAuto) return 0;  // no host link: none needed
  const int64_t available = host_available_memory_bytes();
  if (m.host_budget.empty()) return available / 2;
  const auto bytes = parse_byte_size(m.host_budget, available);
  if (!bytes) {
    throw UserError(c.source + ": memory.host_budget = \"" + m.host_budget + "\" is not a memory size; use bytes "
                    "with a unit (\"8GiB\", \"500MB\") or a share of the host's available memory (\"50%\")");
  }
  return *bytes;
}

RunPlan plan_of_config(const Config& c, int replicas) {
  RunPlan plan;
  plan.source = c.source;
  plan.device = c.training.device;
  plan.seed = static_cast<uint64_t>(c.job.seed);
  plan.channels_last = c.training.channels_last;
  GridPlan& g = plan.grid;
  g.data = replicas;
  g.tensor = static_cast<int>(c.parallel.tensor_parallel);
  g.context = static_cast<int>(c.parallel.context_parallel);
  g.pipeline = static_cast<int>(c.parallel.pipeline_parallel);
  g.sequence_parallel = g.tensor > 1 && c.parallel.sequence_parallel;
  BatchPlan& b = plan.batch;
  b.global = c.training.global_batch_size;
  const int64_t local = b.global / replicas;
  b.micro = c.training.micro_batch_size > 0 ? c.training.micro_batch_size : local;
  b.micro_batches = local / b.micro;
  plan.memory = memory_plan_of(c);
  SyncPlan& s = plan.sync;
  // ZeRO shards over every rank with these weights: the replicas' context ranks too.
  s.shard = replicas * g.context > 1 ? c.parallel.shard : ShardLevel::kNone;
  s.bucket_bytes = c.parallel.bucket_mb << 20;
  s.overlap = c.parallel.overlap;
  s.prefetch = c.parallel.prefetch;
  s.timeout_s = c.parallel.timeout_s;
  PipelinePlan& p = plan.pipeline;
  p.schedule = c.parallel.pipeline_schedule;
  p.virtual_stages = c.parallel.virtual_stages;
  p.stage_blocks = c.parallel.stage_blocks;
  p.stage_costs = c.parallel.stage_costs;
  p.p2p = c.parallel.pipeline_p2p;
  // As the config says it; the launcher sets it from the group it made (ranks sharing a GPU: MPI).
  p.posting_order = p.p2p == PipelineP2p::kNcclLike || c.training.device != "cpu";
  plan.precision = c.training.mixed_precision;
  plan.compute_weights = c.training.compute_weights;
  plan.gradient_dtype = c.training.gradient_dtype;
  plan.loss_scale = LossScalerOptions{c.training.loss_scale, c.training.loss_scale_growth,
                                      c.training.loss_scale_backoff, c.training.loss_scale_growth_interval};
  plan.optimizer = optimizer_options_of(c.training);
  plan.loop = loop_of(c);
  return plan;
}

RunPlan run_plan_of(const Config& c, const ProcessGrid& grid, std::vector<std::string>* warnings) {
  check_replicas(c, grid.data_parallel);
  RunPlan plan = plan_of_config(c, grid.data_parallel);
  check_pipeline(c, plan.batch);
  plan.device = device_of_rank(c, grid);
  GridPlan& g = plan.grid;
  g.tensor = grid.tensor_parallel;
  g.context = grid.context_parallel;
  g.pipeline = grid.pipeline_parallel;
  g.replica = grid.replica;
  g.context_rank = grid.context_rank;
  g.tensor_rank = grid.tensor_rank;
  g.stage = grid.stage;
  // memory.block_keep per stage: this rank keeps its stage's share.
  const std::vector<double>& shares = plan.memory.stage_block_keep;
  if (!shares.empty()) {
    if (static_cast<size_t>(grid.stage) >= shares.size()) {
      throw UserError(c.source + ": memory.block_keep = \"" + c.memory.block_keep + "\" names " +
                      std::to_string(shares.size()) + " shares and this rank is pipeline stage " +
                      std::to_string(grid.stage) + "; give one share per stage");
    }
    plan.memory.block_keep_bytes = 0;
    plan.memory.block_keep_share = shares[static_cast<size_t>(grid.stage)];
  }
  g.sequence_parallel = grid.tensor_parallel > 1 && c.parallel.sequence_parallel;
  if (c.parallel.shard != ShardLevel::kNone && grid.data_parallel * grid.context_parallel == 1 && warnings != nullptr) {
    warnings->push_back("parallel.shard = \"" + std::string(choice_name(c.parallel.shard)) +
                        "\" has no effect with one data-parallel rank: each rank's share is the whole");
  }
  return plan;
}

RunPlan run_plan_of(const Config& config) { return run_plan_of(config, ProcessGrid{}); }

Config config_as_run(const Config& config, const RunPlan& plan) {
  Config c = config;
  c.training.device = plan.device;
  const GridPlan& g = plan.grid;
  c.parallel.data_parallel = g.data;
  c.parallel.pipeline_parallel = g.pipeline;
  c.parallel.tensor_parallel = g.tensor;
  c.parallel.context_parallel = g.context;
  c.parallel.sequence_parallel = g.sequence_parallel;
  if (g.pipeline > 1) {
    c.parallel.pipeline_schedule = plan.pipeline.schedule;
    c.parallel.virtual_stages = plan.pipeline.virtual_stages;
  }
  // The cut the plan names (empty: balanced when the job starts; none without stages).
  c.parallel.stage_blocks = g.pipeline > 1 ? plan.pipeline.stage_blocks : std::vector<int64_t>{};
  c.parallel.shard = plan.sync.shard;
  if (plan.sync.shard == ShardLevel::kParameters) c.parallel.prefetch = plan.sync.prefetch;
  const int64_t configured = config.training.micro_batch_size > 0 ? config.training.micro_batch_size : plan.batch.local();
  if (plan.batch.micro != configured) {
    c.training.micro_batch_size = plan.batch.micro == plan.batch.local() ? 0 : plan.batch.micro;
  }
  c.training.mixed_precision = plan.precision;
  c.training.compute_weights = plan.compute_weights;
  c.training.gradient_dtype = plan.gradient_dtype;
  const MemoryPlan& m = plan.memory;
  if (m.budget_bytes != budget_bytes_of(config)) c.memory.budget = std::to_string(m.budget_bytes);
  c.memory.policy = m.policy;
  c.memory.block_keep.clear();  // neither: left to the run check; under other policies, none
  if (m.policy == MemoryPolicy::kPerBlock && !m.stage_block_keep.empty()) {
    for (double s : m.stage_block_keep) {
      char share[32];
      std::snprintf(share, sizeof share, "%s%.9g%%", c.memory.block_keep.empty() ? "" : ",", 100 * s);
      c.memory.block_keep += share;
    }
  } else if (m.policy == MemoryPolicy::kPerBlock && m.block_keep_share > 0) {
    char share[32];
    std::snprintf(share, sizeof share, "%.9g%%", 100 * m.block_keep_share);
    c.memory.block_keep = share;
  } else if (m.policy == MemoryPolicy::kPerBlock && m.block_keep_bytes > 0) {
    c.memory.block_keep = std::to_string(m.block_keep_bytes);
  }
  c.memory.block_offload = m.block_offload;
  if (m.block_offload && m.host_budget_bytes > 0) c.memory.host_budget = std::to_string(m.host_budget_bytes);
  c.memory.eviction_threshold = m.eviction_threshold;
  c.memory.optimizer_state = m.optimizer_state;
  return c;
}

}  // namespace ht

#include "launcher/planning/job_plan.h"
#include "base/clock.h"

#include "launcher/config/run_plan_of.h"
#include "planner/gradient_blocks.h"
#include "planner/weight_copy_terms.h"

#include "launcher/planning/device_catalog.h"
#include "launcher/planning/profiler.h"
#include "launcher/planning/split_profiles.h"
#include "launcher/planning/trace_profile.h"
#include "planner/layout_search.h"
#include "planner/traced_memory.h"
#include "alloc/byte_size.h"
#include "runtime/thread_pools.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstring>
#include <vector>

namespace ht {
namespace {

// GB/s of a large memory copy here: what ranks sharing a host move gradients at.
double copy_gbps() {
  const size_t bytes = size_t{64} << 20;
  std::vector<char> a(bytes, 1), b(bytes, 0);
  std::memcpy(b.data(), a.data(), bytes);  // fault the pages in first
  double best = 0;
  for (int i = 0; i < 3; ++i) {
    const auto start = std::chrono::steady_clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    const double s = seconds_since(start);
    best = std::max(best, static_cast<double>(bytes) / s / 1e9);
  }
  return best;
}

// The CPUs this process may use: the host's threads, fewer under a binding or a container's CPU
// quota (runtime/thread_pools.h).
int usable_cpus() { return default_thread_count(1); }

}  // namespace

Machine machine_for(const Config& config, const PlanArgs& args, int max_ranks) {
  Machine m;
  m.host_link_gbps = config.memory.host_link_gbps;
  const ClusterConfig& k = config.cluster;
  if (k.nodes > 0) {
    m.nodes = static_cast<int>(k.nodes);
    m.devices_per_node = static_cast<int>(k.devices_per_node);
    m.shared_host = false;
    m.device_memory = args.device_memory > 0 ? args.device_memory : k.device_memory_bytes;
    m.intra_node_gbps = k.intra_node_gbps;
    m.inter_node_gbps = k.inter_node_gbps;
    m.intra_node_latency_us = k.intra_node_latency_us;
    m.inter_node_latency_us = k.inter_node_latency_us;
    m.device_speed = k.device.empty() ? k.device_speed : 1.0;  // traced: the kind's own times
    m.host_memory = k.host_memory_bytes / std::max(1, m.devices_per_node);
    if (!k.device.empty()) {  // a catalog kind is a GPU: its process's context and NCCL's buffers
      m.runtime_bytes = std::llround(k.runtime_mib * 1024 * 1024);
      m.communicator_bytes = std::llround(k.communicator_mib * 1024 * 1024);
      m.p2p_in_posting_order = true;
    }
    char text[400];
    const std::string reserved = k.device.empty() ? "" : " (the runtime holds " + format_bytes(m.runtime_bytes) + ", and " +
                                                             format_bytes(m.communicator_bytes) + " a communicator)";
    std::snprintf(text, sizeof text, "%s [cluster]: %d node(s) x %d devices of %s%s, %.0f GB/s within a node, "
                  "%.0f GB/s between", config.source.c_str(), m.nodes, m.devices_per_node,
                  format_bytes(m.device_memory).c_str(), reserved.c_str(), k.intra_node_gbps, k.inter_node_gbps);
    m.description = text;
    if (!k.device.empty()) {
      const DeviceKind kind = catalog_kind(k.device, args.devices_file, config.source + ": cluster.device");
      m.peak_half_flops_per_ms = kind.bf16_tflops * 1e9;
      m.peak_float_flops_per_ms = kind.fp32_tflops * 1e9;
      m.description = "a cluster of " + kind.name + ": " + m.description;
    } else {
      std::snprintf(text, sizeof text, ", devices %gx the one profiled here", k.device_speed);
      m.description += text;
    }
    return m;
  }
  // This machine: CPU ranks share its cores and its memory; MPI moves gradients through shared
  // memory, a copy in and a copy out.
  // training.threads is a rank's: the host keeps its own (until 2026-11-29 it was taken for the
  // host's, and 2 ranks of one thread on 2 cores were predicted oversubscribed, at twice the step).
  m.host_threads = args.ranks_on_host > 0 ? host_cpus_of_ranks(args.ranks_on_host) : usable_cpus();
  m.rank_threads = static_cast<int>(config.training.threads);
  m.devices_per_node = std::max(1, max_ranks);
  m.shared_host = true;
  // One rank reduces nothing: the copy benchmark (128 MiB touched) would only slow every run down.
  const double gbps = max_ranks > 1 ? copy_gbps() : 0;
  m.intra_node_gbps = m.inter_node_gbps = gbps > 0 ? gbps / 2 : 1;
  m.intra_node_latency_us = m.inter_node_latency_us = 20;
  const char* memory_from = "--device-memory";
  m.device_memory = args.device_memory;
  if (m.device_memory == 0 && budget_bytes_of(config) > 0) {
    m.device_memory = budget_bytes_of(config);
    memory_from = "memory.budget";
  } else if (m.device_memory == 0) {
    m.device_memory = host_physical_memory_bytes() / m.devices_per_node;
    memory_from = "host memory shared by the ranks";
  }
  m.host_memory = host_physical_memory_bytes() / m.devices_per_node;
  m.device_is_host = true;
  m.p2p_in_posting_order = config.parallel.pipeline_p2p == PipelineP2p::kNcclLike;
  char text[256];
  std::snprintf(text, sizeof text, "this machine, %d CPUs shared by its ranks, %s per rank (%s)",
                m.host_threads, format_bytes(m.device_memory).c_str(), memory_from);
  std::string description = text;
  if (gbps > 0) {
    std::snprintf(text, sizeof text, ", copies at %.1f GB/s (all-reduce modelled at %.1f GB/s, %.0f us a message)",
                  gbps, m.intra_node_gbps, m.intra_node_latency_us);
    description += text;
  }
  m.description = description;
  return m;
}

namespace {

// The rank counts to plan: the given ones, else powers of two up to the machine's; at most max_ranks.
std::vector<int> planned_ranks(const Config& config, const PlanArgs& args) {
  std::vector<int> ranks = args.ranks;
  const int machine_ranks = config.cluster.nodes > 0
                                ? static_cast<int>(config.cluster.nodes * config.cluster.devices_per_node)
                                : usable_cpus();
  if (ranks.empty()) {
    for (int r = 1; r <= machine_ranks; r *= 2) ranks.push_back(r);
  }
  if (args.max_ranks > 0) ranks.erase(std::remove_if(ranks.begin(), ranks.end(), [&](int r) { return r > args.max_ranks; }),
                                      ranks.end());
  return ranks;
}


}  // namespace

JobPlan plan_job(const Config& config, const Dataset* train, const DataInfo& info, const PlanArgs& args) {
  JobPlan out;
  SearchOptions search;
  search.objective = args.objective;
  search.policies = args.policies;
  search.shards = args.shards;
  search.precisions = args.precisions;
  search.gradient_dtype = config.training.gradient_dtype;
  if (search.precisions.empty()) {
    search.precisions = {config.training.mixed_precision};
    if (config.training.mixed_precision != MixedPrecision::kBf16) search.precisions.push_back(MixedPrecision::kBf16);
  }
  const std::vector<int> ranks = planned_ranks(config, args);
  search.ranks = ranks;
  const int most = ranks.empty() ? 1 : *std::max_element(ranks.begin(), ranks.end());
  out.machine = machine_for(config, args, most);
  // A job profiled on a GPU plans no budgets (they are CPU-only there for now). For a catalog
  // device: without eviction first, DTR where nothing fits so (rank_layouts).
  const bool traced = !config.cluster.device.empty();
  const bool evict_if_needed =
      traced && std::find(args.policies.begin(), args.policies.end(), MemoryPolicy::kDtr) != args.policies.end();
  // Full recomputation in every cluster search: a forward more against more devices; per_block's
  // offload too where the nodes' host memory is described (a GPU's host link: copy streams).
  if (traced) {
    search.policies = {MemoryPolicy::kNone};
    for (MemoryPolicy recomputing : {MemoryPolicy::kFull, MemoryPolicy::kPerBlock}) {
      if (std::find(args.policies.begin(), args.policies.end(), recomputing) != args.policies.end())
        search.policies.push_back(recomputing);
    }
    search.block_offload = config.cluster.host_memory_bytes > 0;
  } else if (config.training.device != "cpu") {
    search.policies = {MemoryPolicy::kNone};
  } else {
    search.block_offload = true;  // CPU ranks: per_block may offload over today's host link
  }
  TraceRequest trace;
  if (traced) {
    const DeviceKind kind = catalog_kind(config.cluster.device, args.devices_file, config.source + ": cluster.device");
    trace.rates = device_rates(kind);
    trace.fused_optimizer = fused_on_gpu(config.training);
    trace.gpu = true;  // the catalog's kinds are GPUs
    trace.precisions = search.precisions;
    trace.train_samples = train != nullptr ? train->size() : args.train_samples;
    out.time_source = "step times: each traced kernel's work at " + trace.rates.calibration;
  } else if (train == nullptr) {
    throw std::invalid_argument("plan_job: a profile needs the training set");
  }

  ProfileRequest request;
  request.precisions = search.precisions;
  const int fewest = ranks.empty() ? 1 : *std::min_element(ranks.begin(), ranks.end());
  const int64_t global_batch = config.training.global_batch_size;
  request.sizes = args.trained_sizes;  // each split's largest micro-batch is its own (split_profile)
  trace.device_memory = out.machine.device_memory;
  // Megatron's interleaved schedule beside 1F1B, two chunks a stage, for a cluster.
  if (traced) search.virtual_stages = 2;
  // A rank of a run profiles on the cores it is bound to: no more threads than it may use.
  request.threads = out.machine.shared_host ? std::min(threads_per_rank(out.machine, 1), usable_cpus()) : at::get_num_threads();
  request.one_thread_point = out.machine.shared_host && most > 1 && request.threads > 1;
  const bool sequence_parallel = config.parallel.tensor_parallel > 1 ? config.parallel.sequence_parallel : true;
  search.splits = profile_splits(config, train, info, args, SplitRequest{request, trace, most, fewest, sequence_parallel},
                                 out.machine, out.split_profiles);
  search.sequence_parallel = sequence_parallel;
  search.async_checkpoint = config.checkpoint.async && config.checkpoint.interval > 0;
  out.profile = out.split_profiles.at(search.splits.front());

  // Stages: at most the model's blocks (a stage holds one or more).
  const int blocks = static_cast<int>(out.profile.block_parameter_bytes.size());
  search.stages.clear();
  std::vector<int> stages = args.stages;
  if (stages.empty()) stages = traced ? std::vector<int>{1, 2, 4, 8, 16} : std::vector<int>{1, 2, 4};
  for (int s : stages)
    if (s == 1 || s <= blocks) search.stages.push_back(s);
  // A model that needs a cluster may need one sample per micro-batch and many of them: as many as
  // the largest replica's samples (t x c ranks and stages make fewer replicas, each with more).
  if (traced) {
    int64_t most_samples = 1;
    for (const RankSplit& split : search.splits)
      for (int s : search.stages)
        most_samples = std::max(most_samples, replica_batch(global_batch, fewest, split.tensor * split.context * s));
    search.max_accumulation = static_cast<int>(std::min<int64_t>(most_samples, 1024));
  }
  LayoutSearch layouts;
  layouts.options = search;
  layouts.global_batch = config.training.global_batch_size;
  layouts.device_arenas = traced;
  layouts.evict_if_needed = evict_if_needed;
  layouts.threads = usable_cpus();
  out.ranked = rank_layouts(out.split_profiles, out.machine, layouts);
  out.why = why_it_wins(out.ranked, args.objective);
  return out;
}

std::string smallest_fitting_cluster(const Config& config, const DataInfo& info, const PlanArgs& args,
                                     const JobPlan& plan) {
  if (config.cluster.device.empty()) return "";
  const DeviceKind kind = catalog_kind(config.cluster.device, args.devices_file, config.source + ": cluster.device");
  SplitProfiles profiles = plan.split_profiles;
  std::vector<std::pair<int, int>> shapes;  // nodes x devices, growing
  for (int d = 1; d < kind.devices_per_node; d *= 2) shapes.emplace_back(1, d);
  for (int n = 1; n <= 128; n *= 2) shapes.emplace_back(n, kind.devices_per_node);
  for (const auto& [nodes, devices] : shapes) {
    if (nodes * devices <= static_cast<int>(config.cluster.nodes * config.cluster.devices_per_node)) continue;
    Config c = config;
    c.cluster.nodes = nodes;
    c.cluster.devices_per_node = devices;
    PlanArgs a = args;
    a.ranks.clear();
    a.max_ranks = 0;
    a.profiles = &profiles;
    const JobPlan bigger = plan_job(c, nullptr, info, a);
    for (const auto& [split, p] : bigger.split_profiles) profiles.emplace(split, p);
    if (!bigger.ranked.empty() && bigger.ranked[0].prediction.fits) {
      return kind.kind + ":" + std::to_string(nodes) + "x" + std::to_string(devices) + " (" +
             plan_words(bigger.ranked[0].plan) + ")";
    }
  }
  return "";
}

RunPlan planned_run(const Config& base, const Plan& plan) {
  RunPlan run = plan_of_config(base, plan.ranks);
  // Planned for a catalog device (every kind is a GPU): it trains there, on CUDA.
  if (!base.cluster.device.empty() && run.device == "cpu") run.device = "cuda";
  run.grid.pipeline = plan.stages;
  run.grid.tensor = plan.tensor;
  run.grid.sequence_parallel = plan.tensor > 1 && plan.sequence_parallel;
  run.grid.context = plan.context;
  if (plan.stages > 1) {
    run.pipeline.schedule = plan.schedule;
    run.pipeline.virtual_stages = plan.schedule == ScheduleKind::kInterleaved1f1b ? plan.virtual_stages : 1;
  }
  // The cut the plan was predicted for (none without stages, whatever the base config said).
  run.pipeline.stage_blocks.assign(plan.stage_blocks.begin(), plan.stage_blocks.end());
  run.sync.shard = plan.shard;
  if (plan.shard == ShardLevel::kParameters) run.sync.prefetch = plan.prefetch;
  run.batch.micro = plan.micro_batch;
  run.batch.micro_batches = plan.accumulation;
  run.precision = plan.precision;
  // The 16-bit weights as the plan was predicted with them, where the config left them to auto
  // (a search's candidates leave them to auto; its twins that did not fit kept copies cast).
  if (base.training.compute_weights == ComputeWeightsMode::kAuto && autocast_type(plan.precision)) {
    run.compute_weights = keeps_weight_copies(plan) ? ComputeWeightsMode::kKept : ComputeWeightsMode::kCast;
  }
  // The gradients' type as predicted (a twin that fit only with bf16 gradients says so).
  if (plan.precision == MixedPrecision::kBf16) run.gradient_dtype = plan.gradient_dtype;
  run.memory.policy = plan.policy;
  run.memory.block_keep_bytes = plan.block_keep_bytes;
  run.memory.block_keep_share = plan.block_keep_share;
  run.memory.stage_block_keep = plan.policy == MemoryPolicy::kPerBlock && plan.stages > 1 ? plan.stage_block_keep
                                                                                           : std::vector<double>{};
  run.memory.block_offload = plan.policy == MemoryPolicy::kPerBlock && plan.block_offload;
  if (run.memory.block_offload) {
    if (plan.host_budget_bytes > 0) run.memory.host_budget_bytes = plan.host_budget_bytes;
    // Nothing kept on the device (all offloaded or recomputed): every stage's 0%, as the config says it.
    if (plan.block_keep_bytes == 0 && plan.block_keep_share == 0 && run.memory.stage_block_keep.empty())
      run.memory.stage_block_keep.assign(static_cast<size_t>(std::max(1, plan.stages)), 0.0);
  }
  if (plan.state_on_host && swaps(plan.policy)) run.memory.optimizer_state = StatePlace::kHost;
  // The search's plans carry the default threshold, and leave the base config's; one that chose
  // another (memory.policy = "auto"'s) sets it.
  if (evicts(plan.policy) && plan.eviction_threshold != Plan{}.eviction_threshold) {
    run.memory.eviction_threshold = plan.eviction_threshold;
  }
  if (plan.budget_bytes > 0) run.memory.budget_bytes = plan.budget_bytes;  // a GPU plan has one only where it evicts
  return run;
}

Config config_for_plan(const Config& base, const Plan& plan) {
  Config c = config_as_run(base, planned_run(base, plan));
  // The exchange is the model's option (models/decoder_options.h), not the run plan's: the plan's
  // own, which a search of both exchanges may have chosen against the config's.
  if (plan.context > 1) c.parallel.context_exchange = plan.context_exchange;
  return c;
}

}  // namespace ht

#include "launcher/planning/job_plan.h"

#include "launcher/planning/profiler.h"
#include "launcher/model_factory.h"
#include "launcher/user_error.h"
#include "alloc/byte_size.h"
#include "runtime/thread_pools.h"

#include <ATen/Parallel.h>

#include <algorithm>
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
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, static_cast<double>(bytes) / s / 1e9);
  }
  return best;
}

// The CPUs this process may use: the host's threads, fewer under a binding or a container's CPU
// quota (runtime/thread_pools.h).
int usable_cpus() { return default_thread_count(1); }

// An eviction plan that evicts nothing is its plan without eviction, listed twice: keep the one
// without, unless it alone does not fit.
void drop_idle_eviction(std::vector<RankedPlan>& ranked) {
  auto twin_fits = [&](const Plan& p) {
    for (const RankedPlan& r : ranked) {
      const Plan& q = r.plan;
      if (!evicts(q.policy) && q.ranks == p.ranks && q.micro_batch == p.micro_batch && q.precision == p.precision)
        return r.prediction.fits;
    }
    return false;
  };
  std::vector<char> drop;
  for (const RankedPlan& r : ranked) {
    drop.push_back(evicts(r.plan.policy) && r.prediction.evictions == 0 && twin_fits(r.plan));
  }
  std::vector<RankedPlan> kept;
  for (size_t i = 0; i < ranked.size(); ++i) {
    if (!drop[i]) kept.push_back(std::move(ranked[i]));
  }
  ranked = std::move(kept);
}

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
    m.device_speed = k.device_speed;
    char text[320];
    std::snprintf(text, sizeof text, "%s [cluster]: %d node(s) x %d devices of %s, %.0f GB/s within a node, "
                  "%.0f GB/s between, devices %gx the one profiled here", config.source.c_str(), m.nodes,
                  m.devices_per_node, format_bytes(m.device_memory).c_str(), k.intra_node_gbps, k.inter_node_gbps,
                  k.device_speed);
    m.description = text;
    return m;
  }
  // This machine: CPU ranks share its cores and its memory; MPI moves gradients through shared
  // memory, a copy in and a copy out.
  m.host_threads = config.training.threads > 0 ? static_cast<int>(config.training.threads) : usable_cpus();
  m.devices_per_node = std::max(1, max_ranks);
  m.shared_host = true;
  // One rank reduces nothing: the copy benchmark (128 MiB touched) would only slow every run down.
  const double gbps = max_ranks > 1 ? copy_gbps() : 0;
  m.intra_node_gbps = m.inter_node_gbps = gbps > 0 ? gbps / 2 : 1;
  m.intra_node_latency_us = m.inter_node_latency_us = 20;
  const char* memory_from = "--device-memory";
  m.device_memory = args.device_memory;
  if (m.device_memory == 0 && config.memory.budget_bytes > 0) {
    m.device_memory = config.memory.budget_bytes;
    memory_from = "memory.budget";
  } else if (m.device_memory == 0) {
    m.device_memory = host_physical_memory_bytes() / m.devices_per_node;
    memory_from = "host memory shared by the ranks";
  }
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

JobPlan plan_job(const Config& config, const Dataset& train, const DataInfo& info, const PlanArgs& args) {
  JobPlan out;
  SearchOptions search;
  search.objective = args.objective;
  search.policies = args.policies;
  search.shards = args.shards;
  search.precisions = args.precisions;
  if (search.precisions.empty()) {
    search.precisions = {config.training.mixed_precision};
    if (config.training.mixed_precision != MixedPrecision::kBf16) search.precisions.push_back(MixedPrecision::kBf16);
  }
  std::vector<int> ranks = args.ranks;
  const int machine_ranks = config.cluster.nodes > 0
                                ? static_cast<int>(config.cluster.nodes * config.cluster.devices_per_node)
                                : usable_cpus();
  if (ranks.empty()) {
    for (int r = 1; r <= machine_ranks; r *= 2) ranks.push_back(r);
  }
  if (args.max_ranks > 0) ranks.erase(std::remove_if(ranks.begin(), ranks.end(), [&](int r) { return r > args.max_ranks; }),
                                      ranks.end());
  search.ranks = ranks;
  const int most = ranks.empty() ? 1 : *std::max_element(ranks.begin(), ranks.end());
  out.machine = machine_for(config, args, most);
  if (config.training.device != "cpu") search.policies = {MemoryPolicy::kNone};  // budgets are CPU-only for now

  ProfileRequest request;
  request.precisions = search.precisions;
  const int fewest = ranks.empty() ? 1 : *std::min_element(ranks.begin(), ranks.end());
  request.largest_micro_batch = std::max<int64_t>(1, config.training.global_batch_size / fewest);
  request.threads = out.machine.shared_host ? out.machine.host_threads : at::get_num_threads();
  request.one_thread_point = out.machine.shared_host && most > 1;
  // One profile per tensor-parallel size: a rank's part of the model, with sequence parallelism
  // as the config has it when it splits, else on (Megatron's advice: the same traffic, activations
  // stored once across the group).
  const bool sequence_parallel = config.parallel.tensor_parallel > 1 ? config.parallel.sequence_parallel : true;
  std::vector<int> tensor = args.tensor.empty() ? std::vector<int>{static_cast<int>(config.parallel.tensor_parallel)} : args.tensor;
  search.tensor.clear();
  for (int t : tensor) {
    if (t < 1 || (t > 1 && !is_decoder(config.model.name))) continue;
    Config c = config;
    c.parallel.tensor_parallel = t;
    c.parallel.sequence_parallel = t > 1 && sequence_parallel;
    if (is_decoder(config.model.name)) {
      DecoderOptions o = decoder_options(config.model, info.classes);
      o.tensor_parallel = t;
      o.sequence_parallel = c.parallel.sequence_parallel;
      if (!o.problem().empty()) continue;  // heads or widths t does not divide
    }
    out.tensor_profiles.emplace(t, profile_job(c, train, info, request));
    search.tensor.push_back(t);
  }
  if (search.tensor.empty()) throw UserError(config.source + ": no tensor-parallel size to plan splits the model");
  search.sequence_parallel = sequence_parallel;
  out.profile = out.tensor_profiles.at(search.tensor.front());

  // Stages: at most the model's blocks (a stage holds one or more).
  const int blocks = static_cast<int>(out.profile.block_parameter_bytes.size());
  search.stages.clear();
  for (int s : args.stages)
    if (s == 1 || s <= blocks) search.stages.push_back(s);
  const std::vector<Plan> plans =
      candidate_plans(config.training.global_batch_size, out.machine.device_memory, search);
  out.ranked = rank_plans(plans, [&](const Plan& p) { return predict(out.tensor_profiles.at(p.tensor), out.machine, p); },
                          args.objective);
  drop_idle_eviction(out.ranked);
  out.why = why_it_wins(out.ranked, args.objective);
  return out;
}

Config config_for_plan(const Config& base, const Plan& plan) {
  Config c = base;
  c.parallel.data_parallel = plan.ranks;
  c.parallel.pipeline_parallel = plan.stages;
  c.parallel.tensor_parallel = plan.tensor;
  c.parallel.sequence_parallel = plan.tensor > 1 && plan.sequence_parallel;
  if (plan.stages > 1) c.parallel.pipeline_schedule = plan.schedule;
  c.parallel.shard = plan.shard;
  if (plan.shard == ShardLevel::kParameters) c.parallel.prefetch = plan.prefetch;
  c.training.micro_batch_size = plan.accumulation > 1 ? plan.micro_batch : 0;
  c.training.mixed_precision = plan.precision;
  c.memory.policy = plan.policy;
  if (c.training.device == "cpu" && plan.budget_bytes > 0) {
    c.memory.budget = std::to_string(plan.budget_bytes);
    c.memory.budget_bytes = plan.budget_bytes;
  }
  return c;
}

std::string plan_words(const Plan& p) {
  return describe_plan(p) + (p.budget_bytes > 0 ? " at " + format_bytes(p.budget_bytes) : "");
}

}  // namespace ht

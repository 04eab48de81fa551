#include "planner/shard_terms.h"

#include "parallel/shard_layout.h"

#include <algorithm>
#include <cmath>

namespace ht {

int64_t shard_elements(const std::vector<std::vector<int64_t>>& buckets, int ranks) {
  int64_t n = 0;
  for (const std::vector<int64_t>& members : buckets) n += shard_bucket(members, ranks).counts.front();
  return n;
}

int64_t state_bytes_per_element(const ModelProfile& profile) {
  // The arena rounds one block by at most 63 bytes: integer division undoes it.
  return profile.parameters > 0 ? profile.optimizer_state_bytes / profile.parameters : 0;
}

double allgather_ms(const Machine& machine, int ranks, int64_t bytes) {
  if (ranks <= 1) return 0;
  const bool one_node = ranks <= machine.devices_per_node;
  const double gbps = one_node ? machine.intra_node_gbps : machine.inter_node_gbps;
  const double latency_us = one_node ? machine.intra_node_latency_us : machine.inter_node_latency_us;
  const double chunk = static_cast<double>(bytes) / ranks;
  return (ranks - 1) * (latency_us * 1e-3 + chunk / (gbps * 1e9) * 1e3);
}

const std::vector<std::vector<int64_t>>& sharded_buckets(const ModelProfile& profile, ShardLevel level) {
  return level == ShardLevel::kParameters && !profile.block_buckets.empty() ? profile.block_buckets : profile.buckets;
}

int64_t gathered_parameter_bytes(const ModelProfile& profile, int64_t element_bytes,
                                 const std::vector<size_t>* backward_reads) {
  const std::vector<std::vector<int64_t>>& buckets = profile.block_buckets;
  const std::vector<std::vector<size_t>>& uses = profile.block_bucket_uses;
  if (buckets.empty() || uses.empty()) return 0;
  std::vector<int64_t> bytes;
  for (const std::vector<int64_t>& members : buckets) {
    int64_t n = 0;
    for (int64_t e : members) n += e;
    bytes.push_back(arena_bytes(element_bytes * n));
  }
  // Buckets more than one block reads (tied weights) stay gathered from their first read in
  // backward to its end.
  std::vector<int> readers(buckets.size(), 0);
  for (const std::vector<size_t>& u : uses)
    for (size_t b : u) ++readers[b];
  std::vector<bool> read_back(buckets.size(), backward_reads == nullptr);
  if (backward_reads != nullptr)
    for (size_t b : *backward_reads) read_back[b] = true;
  auto held = [&](const std::vector<size_t>& block, bool backward) {
    int64_t n = 0;
    for (size_t b = 0; b < buckets.size(); ++b) {
      const bool in_block = std::find(block.begin(), block.end(), b) != block.end();
      if ((in_block || readers[b] > 1) && (!backward || read_back[b])) n += bytes[b];
    }
    return n;
  };
  // Forward ends with the last block's buckets gathered (what backward reads first); backward
  // gathers each block's buckets that it reads again.
  int64_t most = held(uses.back(), /*backward=*/false);
  for (const std::vector<size_t>& block : uses) most = std::max(most, held(block, /*backward=*/true));
  return most;
}

double shard_step_share(const ModelProfile& profile, const Plan& plan) {
  const auto& buckets = sharded_buckets(profile, plan.shard);
  if (plan.shard == ShardLevel::kNone || plan.ranks <= 1 || buckets.empty() || profile.parameters <= 0) return 1;
  return static_cast<double>(shard_elements(buckets, plan.ranks)) / static_cast<double>(profile.parameters);
}

void shard_memory_terms(const ModelProfile& profile, const Plan& plan, Prediction& p) {
  const auto& buckets = sharded_buckets(profile, plan.shard);
  if (plan.shard == ShardLevel::kNone || plan.ranks <= 1 || buckets.empty()) return;
  const int64_t per_element = state_bytes_per_element(profile);
  const int64_t element = profile.parameters > 0 ? profile.gradient_bytes / profile.parameters : 4;
  // Each rank's share and its largest piece: the optimizer's temporaries are the size of the
  // largest tensor it steps, measured whole with the largest parameter.
  std::vector<int64_t> elements(static_cast<size_t>(plan.ranks)), largest_piece(static_cast<size_t>(plan.ranks));
  std::vector<int64_t> gradient_shards(static_cast<size_t>(plan.ranks));  // "gradients": one tensor a bucket
  std::vector<int64_t> parameter_shards(static_cast<size_t>(plan.ranks));  // "parameters": one tensor a bucket
  int64_t largest = 0, largest_bucket = 0, bucketed = 0;
  for (const std::vector<int64_t>& members : buckets) {
    int64_t bucket = 0;
    for (int64_t n : members) {
      largest = std::max(largest, n);
      bucket += n;
    }
    largest_bucket = std::max(largest_bucket, bucket);
    bucketed += bucket;
    const BucketShards s = shard_bucket(members, plan.ranks);
    for (size_t r = 0; r < elements.size(); ++r) {
      elements[r] += s.counts[r];
      gradient_shards[r] += arena_bytes(element * s.counts[r]);
      parameter_shards[r] += arena_bytes(4 * s.counts[r]);
      for (const ShardPiece& piece : s.pieces[r]) largest_piece[r] = std::max(largest_piece[r], piece.length);
    }
  }
  // "gradients": the shards, and the block of the bucket backward fills (the largest, taken as if
  // it stayed: blocks live from a bucket's first gradient to its reduce-scatter) in place of the
  // whole gradient block.
  const bool gradients_sharded = plan.shard >= ShardLevel::kGradients;
  const int64_t in_flight = gradients_sharded ? arena_bytes(element * largest_bucket) : 0;
  // "parameters": the bucketed parameters give way to the rank's shards (fp32) and the buckets
  // gathered at once (parallel/parameter_shards.h): the most any block reads, tied buckets held.
  const bool parameters_sharded = plan.shard == ShardLevel::kParameters;
  // Gathered buckets exist while forward and backward run, not in the optimizer's phase.
  // What backward reads again, as the profile saw it at the plan's precision (all, if unseen).
  const std::vector<size_t>* backward_reads = nullptr;
  for (const ProfilePoint& point : profile.points) {
    if (point.precision == plan.precision) backward_reads = &point.backward_read_buckets;
  }
  const int64_t gathered = parameters_sharded ? gathered_parameter_bytes(profile, 4, backward_reads) : 0;
  const int64_t model = parameters_sharded ? p.model_bytes - arena_bytes(4 * bucketed) : p.model_bytes;
  const int64_t fixed = model + (gradients_sharded ? 0 : p.gradient_bytes) + p.sampler_bytes + p.batch_bytes;
  const int64_t whole_working = p.optimizer_working_bytes;
  int64_t peak = -1;
  for (size_t r = 0; r < elements.size(); ++r) {
    const int64_t state = per_element == 0 ? 0 : arena_bytes(per_element * elements[r]);
    const int64_t working =
        largest == 0 ? 0
                     : std::llround(static_cast<double>(whole_working) * static_cast<double>(arena_bytes(element * largest_piece[r])) /
                                    static_cast<double>(arena_bytes(element * largest)));
    const int64_t gradients = gradients_sharded ? gradient_shards[r] + in_flight : 0;
    const int64_t parameters = parameters_sharded ? parameter_shards[r] : 0;
    const int64_t rank_peak = fixed + parameters + gradients + state + std::max(p.activation_bytes + gathered, working);
    if (rank_peak > peak) {  // the fullest rank is the prediction
      peak = rank_peak;
      p.optimizer_state_bytes = state;
      p.optimizer_working_bytes = working;
      if (gradients_sharded) p.gradient_bytes = gradients;
      if (parameters_sharded) p.model_bytes = model + parameters;
    }
  }
  p.peak_bytes = peak;
}

void shard_time_terms(const ModelProfile& profile, const Machine& machine, const Plan& plan, Prediction& p) {
  if (plan.shard == ShardLevel::kNone || plan.ranks <= 1) return;
  int64_t elements = 0;
  for (const std::vector<int64_t>& members : sharded_buckets(profile, plan.shard))
    for (int64_t n : members) elements += n;
  const int64_t bytes = profile.parameters > 0 ? elements * (profile.gradient_bytes / profile.parameters) : 0;
  // After the step, one all-gather of the updated parameters; sharded parameters instead gather
  // every bucket before its forward and again before its backward, each micro-batch, inline
  // (no prefetch yet): exposed.
  const double gathers = plan.shard == ShardLevel::kParameters ? 2.0 * static_cast<double>(plan.accumulation) : 1.0;
  p.gather_ms = allgather_ms(machine, plan.ranks, bytes) * gathers;
  if (plan.shard >= ShardLevel::kGradients) {
    // A reduce-scatter (a ring's half of an all-reduce) for every micro-batch, on the thread that
    // runs backward: nothing hides it.
    p.allreduce_ms = allgather_ms(machine, plan.ranks, bytes) * static_cast<double>(plan.accumulation);
    p.allreduce_exposed_ms = p.allreduce_ms;
  }
}

StepTrace without_optimizer_phase(const StepTrace& trace) {
  size_t last = 0;  // one past the last kernel's end
  for (size_t i = 0; i < trace.events.size(); ++i) {
    if (trace.events[i].kind == TraceEvent::Kind::kKernelEnds) last = i + 1;
  }
  StepTrace out = trace;
  out.events.resize(last);
  std::vector<bool> later(trace.tensors.size(), false);  // allocated after the last kernel
  for (size_t i = last; i < trace.events.size(); ++i) {
    const TraceEvent& e = trace.events[i];
    if (e.kind == TraceEvent::Kind::kAllocated) later[static_cast<size_t>(e.index)] = true;
    if (e.kind == TraceEvent::Kind::kFreed && !later[static_cast<size_t>(e.index)]) out.events.push_back(e);
  }
  return out;
}

}  // namespace ht

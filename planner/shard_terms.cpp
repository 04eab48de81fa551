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

double shard_step_share(const ModelProfile& profile, const Plan& plan) {
  if (plan.shard == ShardLevel::kNone || plan.ranks <= 1 || profile.buckets.empty() || profile.parameters <= 0) return 1;
  return static_cast<double>(shard_elements(profile.buckets, plan.ranks)) / static_cast<double>(profile.parameters);
}

void shard_memory_terms(const ModelProfile& profile, const Plan& plan, Prediction& p) {
  if (plan.shard == ShardLevel::kNone || plan.ranks <= 1 || profile.buckets.empty()) return;
  const int64_t per_element = state_bytes_per_element(profile);
  const int64_t element = profile.parameters > 0 ? profile.gradient_bytes / profile.parameters : 4;
  // Each rank's share and its largest piece: the optimizer's temporaries are the size of the
  // largest tensor it steps, measured whole with the largest parameter.
  std::vector<int64_t> elements(static_cast<size_t>(plan.ranks)), largest_piece(static_cast<size_t>(plan.ranks));
  std::vector<int64_t> gradient_shards(static_cast<size_t>(plan.ranks));  // "gradients": one tensor a bucket
  int64_t largest = 0, largest_bucket = 0;
  for (const std::vector<int64_t>& members : profile.buckets) {
    int64_t bucket = 0;
    for (int64_t n : members) {
      largest = std::max(largest, n);
      bucket += n;
    }
    largest_bucket = std::max(largest_bucket, bucket);
    const BucketShards s = shard_bucket(members, plan.ranks);
    for (size_t r = 0; r < elements.size(); ++r) {
      elements[r] += s.counts[r];
      gradient_shards[r] += arena_bytes(element * s.counts[r]);
      for (const ShardPiece& piece : s.pieces[r]) largest_piece[r] = std::max(largest_piece[r], piece.length);
    }
  }
  // "gradients": the shards, and the block of the bucket backward fills (the largest, taken as if
  // it stayed: blocks live from a bucket's first gradient to its reduce-scatter) in place of the
  // whole gradient block.
  const bool gradients_sharded = plan.shard >= ShardLevel::kGradients;
  const int64_t in_flight = gradients_sharded ? arena_bytes(element * largest_bucket) : 0;
  const int64_t fixed = p.model_bytes + (gradients_sharded ? 0 : p.gradient_bytes) + p.sampler_bytes + p.batch_bytes;
  const int64_t whole_working = p.optimizer_working_bytes;
  int64_t peak = -1;
  for (size_t r = 0; r < elements.size(); ++r) {
    const int64_t state = per_element == 0 ? 0 : arena_bytes(per_element * elements[r]);
    const int64_t working =
        largest == 0 ? 0
                     : std::llround(static_cast<double>(whole_working) * static_cast<double>(arena_bytes(element * largest_piece[r])) /
                                    static_cast<double>(arena_bytes(element * largest)));
    const int64_t gradients = gradients_sharded ? gradient_shards[r] + in_flight : 0;
    const int64_t rank_peak = fixed + gradients + state + std::max(p.activation_bytes, working);
    if (rank_peak > peak) {  // the fullest rank is the prediction
      peak = rank_peak;
      p.optimizer_state_bytes = state;
      p.optimizer_working_bytes = working;
      if (gradients_sharded) p.gradient_bytes = gradients;
    }
  }
  p.peak_bytes = peak;
}

void shard_time_terms(const ModelProfile& profile, const Machine& machine, const Plan& plan, Prediction& p) {
  if (plan.shard == ShardLevel::kNone || plan.ranks <= 1) return;
  int64_t elements = 0;
  for (const std::vector<int64_t>& members : profile.buckets)
    for (int64_t n : members) elements += n;
  const int64_t bytes = profile.parameters > 0 ? elements * (profile.gradient_bytes / profile.parameters) : 0;
  p.gather_ms = allgather_ms(machine, plan.ranks, bytes);
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

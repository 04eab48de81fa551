#include "planner/weight_copy_terms.h"

#include "planner/profile_at.h"
#include "planner/repeated_layers.h"
#include "planner/trace_derived.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace ht {
namespace {

// The most bytes the trace's tensors hold at once without the weights' casts' copies (their
// gradients kept: live_peak_bytes(without_weight_casts(trace)) drops those too).
int64_t live_peak_without_cast_copies(const StepTrace& trace) {
  int64_t live = 0, peak = 0;
  for (const TraceEvent& e : trace.events) {
    if (e.kind != TraceEvent::Kind::kAllocated && e.kind != TraceEvent::Kind::kFreed) continue;
    const TraceTensor& t = trace.tensors[static_cast<size_t>(e.index)];
    if (t.producer >= 0 && static_cast<size_t>(t.producer) < trace.kernels.size() &&
        is_weight_cast(trace.kernels[static_cast<size_t>(t.producer)]))
      continue;
    if (e.kind == TraceEvent::Kind::kAllocated) peak = std::max(peak, live += t.bytes);
    else live -= t.bytes;
  }
  return peak;
}

}  // namespace

bool keeps_weight_copies(const Plan& plan) {
  return keeps_weight_copies(plan.compute_weights, plan.precision, plan.budget_bytes > 0 && evicts(plan.policy));
}

bool gathers_16bit_copies(const Plan& plan) {
  return keeps_weight_copies(plan) && plan.shard == ShardLevel::kParameters && plan.weight_replicas() > 1;
}

bool shards_masters(const Plan& plan) {
  return shards_masters(plan.shard, plan.weight_replicas(), plan.stages, plan.budget_bytes > 0 && evicts(plan.policy),
                        keeps_weight_copies(plan));
}

StepTrace without_weight_casts(const StepTrace& trace) {
  StepTrace out = trace;
  out.events.clear();
  // Tensors allocated while a backward cast that makes parameters' gradients runs: their fp32
  // gradients (a copy's gradient is added into the fp32 one as it widens: no temporary). Backward
  // tensors name no producer, so they are known by when they are made.
  std::vector<bool> skipped(trace.tensors.size(), false);
  bool in_gradient_cast = false;
  for (const TraceEvent& e : trace.events) {
    if (e.kind == TraceEvent::Kind::kKernelBegins || e.kind == TraceEvent::Kind::kKernelEnds) {
      const TraceKernel& k = trace.kernels[static_cast<size_t>(e.index)];
      in_gradient_cast = e.kind == TraceEvent::Kind::kKernelBegins && k.backward && std::strcmp(k.op, "cast") == 0 &&
                         !k.gradient_buckets.empty();
    } else {
      const auto i = static_cast<size_t>(e.index);
      const TraceTensor& t = trace.tensors[i];
      if (e.kind == TraceEvent::Kind::kAllocated) {
        skipped[i] = in_gradient_cast || (t.producer >= 0 && static_cast<size_t>(t.producer) < trace.kernels.size() &&
                                          is_weight_cast(trace.kernels[static_cast<size_t>(t.producer)]));
      }
      if (skipped[i]) continue;
    }
    out.events.push_back(e);
  }
  return out;
}

SharedTrace shared_without_weight_casts(const ModelProfile& profile, const SharedTrace& trace) {
  static std::mutex mutex;  // plans are predicted on several threads (search.cpp)
  return derived_from(profile.uncast_traces, mutex, trace, 8, [&] { return without_weight_casts(*trace); });
}

bool walks_without_casts(const Plan& plan) {
  return keeps_weight_copies(plan) && !gathers_16bit_copies(plan) && plan.stages == 1 &&
         plan.policy == MemoryPolicy::kNone;
}

int64_t activations_without_casts_change(const ModelProfile& profile, const Plan& plan) {
  static std::mutex mutex;  // plans are predicted on several threads (search.cpp)
  const auto key = std::make_pair(plan.micro_batch, static_cast<int>(plan.precision));
  {
    const std::lock_guard<std::mutex> lock(mutex);
    auto it = profile.uncast_peak_changes.find(key);
    if (it != profile.uncast_peak_changes.end()) return it->second;
  }
  const SharedTrace trace = shared_trace_for(profile, plan.micro_batch, plan.micro_batch, plan.precision);
  const int64_t change =
      trace->events.empty() ? 0 : live_peak_bytes(*shared_without_weight_casts(profile, trace)) - live_peak_bytes(*trace);
  const std::lock_guard<std::mutex> lock(mutex);
  profile.uncast_peak_changes.emplace(key, change);
  return change;
}

std::optional<Plan> weight_cast_twin(const Plan& plan) {
  if (plan.compute_weights != ComputeWeightsMode::kAuto || !keeps_weight_copies(plan)) return std::nullopt;
  Plan twin = plan;
  twin.compute_weights = ComputeWeightsMode::kCast;
  return twin;
}

int64_t weight_casts_alive_at_peak(const StepTrace& trace) {
  return live_peak_bytes(trace) - live_peak_without_cast_copies(trace);
}

int64_t weight_casts_alive_at_peak(const ModelProfile& profile, const ProfilePoint& point) {
  static std::mutex mutex;  // plans are predicted on several threads (search.cpp)
  const auto key = std::make_tuple(point.micro_batch, static_cast<int>(point.precision), point.threads);
  {
    const std::lock_guard<std::mutex> lock(mutex);
    auto it = profile.casts_alive_at_peak.find(key);
    if (it != profile.casts_alive_at_peak.end()) return it->second;
  }
  const int64_t bytes = weight_casts_alive_at_peak(point.trace);
  const std::lock_guard<std::mutex> lock(mutex);
  profile.casts_alive_at_peak.emplace(key, bytes);
  return bytes;
}

WeightCasts weight_casts(const ModelProfile& profile, MixedPrecision precision, int64_t micro_batch) {
  WeightCasts w;
  const ProfilePoint* nearest = nullptr;
  for (const ProfilePoint& pt : profile.points) {
    if (pt.precision != precision || pt.trace.kernels.empty()) continue;
    if (nearest == nullptr || std::llabs(pt.micro_batch - micro_batch) < std::llabs(nearest->micro_batch - micro_batch))
      nearest = &pt;
  }
  if (nearest != nullptr) {
    const ProfilePoint& pt = *nearest;
    double casts = 0, backward_casts = 0;
    for (const TraceKernel& k : pt.trace.kernels) {
      if (std::strcmp(k.op, "cast") != 0) continue;
      (k.backward ? backward_casts : casts) += k.ms;
      if (!is_weight_cast(k)) continue;
      w.forward_ms += k.ms;
      // fp32 in, 16 bits out: a third of the bytes it moves is the copy.
      w.copy_bytes += static_cast<int64_t>(k.bytes / 3);
    }
    w.backward_ms = casts > 0 ? backward_casts * w.forward_ms / casts : 0;
    w.alive_at_peak = weight_casts_alive_at_peak(profile, pt);
  }
  return w;  // per micro-batch whatever its size: the weights' casts
}

std::optional<Plan> weight_kept_twin(const Plan& plan) {
  if (plan.compute_weights != ComputeWeightsMode::kAuto || !recomputes_blocks(plan.policy) ||
      plan.precision == MixedPrecision::kOff || keeps_weight_copies(plan)) {
    return std::nullopt;
  }
  Plan twin = plan;
  twin.compute_weights = ComputeWeightsMode::kKept;
  return twin;
}

Prediction predict_with_weights_that_fit(Plan& plan, const std::function<Prediction(const Plan&)>& predict) {
  if (const std::optional<Plan> kept_twin = weight_kept_twin(plan)) {
    Prediction kept = predict(*kept_twin);
    if (kept.fits) {
      plan = *kept_twin;
      return kept;
    }
    return predict(plan);
  }
  Prediction kept = predict(plan);
  if (kept.fits) return kept;
  const std::optional<Plan> twin = weight_cast_twin(plan);
  if (!twin) return kept;
  Prediction cast = predict(*twin);
  if (!cast.fits) return kept;
  plan = *twin;
  return cast;
}

void weight_copy_memory_terms(const WeightCasts& casts, const Plan& plan, Prediction& p) {
  if (!keeps_weight_copies(plan) || gathers_16bit_copies(plan)) return;  // the shards': shard_memory_terms
  // A pipeline stage keeps its share of the copies (the profile's are the whole model's).
  p.weight_copy_bytes = casts.copy_bytes / plan.stages;
  if (evicts(plan.policy) && plan.budget_bytes > 0) {
    // Asked for under a budget: the replay's step has the casts' copies, which it may drop; the
    // kept ones sit beside them, all the time (an upper bound).
    p.peak_bytes += p.weight_copy_bytes;
    return;
  }
  if (walks_without_casts(plan)) {
    // The step was walked without the casts (state_memory_terms, and ZeRO-2's gradient blocks
    // along it); the copies are there all step, through the optimizer's too.
    p.peak_bytes += p.weight_copy_bytes;
    return;
  }
  p.optimizer_working_bytes += p.weight_copy_bytes;
  p.peak_bytes = std::max(p.peak_bytes, p.fixed_bytes() + p.optimizer_working_bytes);
}

void weight_copy_time_terms(const WeightCasts& w, const Plan& plan, double slowdown, bool replayed, Prediction& p) {
  if (!keeps_weight_copies(plan)) return;
  // The profile's casts are the whole model's (of a tensor-parallel rank): a pipeline stage casts
  // its share of the weights, as many times as the step's micro-batches.
  const double stages = static_cast<double>(plan.stages);
  const double micro_batches = static_cast<double>(plan.accumulation);
  // Every micro-batch's casts and their gradients' casts, less the step's one cast of each weight
  // (under ZeRO-3 and with sharded masters, of each rank's shard).
  const bool shards = gathers_16bit_copies(plan) || shards_masters(plan);
  const double made = shards ? w.forward_ms / static_cast<double>(plan.weight_replicas()) : w.forward_ms;
  const double saved = ((w.forward_ms + w.backward_ms) * micro_batches - made) * slowdown / stages;
  p.compute_ms = std::max(0.0, p.compute_ms - saved);
  double recast = 0;
  if (replayed) recast = std::min(p.recompute_ms, w.forward_ms * micro_batches * slowdown / stages);  // a replay casts again
  p.recompute_ms -= recast;
  p.weight_casts_saved_ms = saved + recast;
}

}  // namespace ht

#include "planner/traced_memory.h"

#include "planner/profile_at.h"
#include "planner/pipeline_terms.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

namespace ht {
namespace {

bool measured_at(const ModelProfile& profile, int64_t micro, MixedPrecision precision) {
  return std::any_of(profile.points.begin(), profile.points.end(), [&](const ProfilePoint& p) {
    return p.micro_batch == micro && p.precision == precision && p.threads == profile.threads;
  });
}

// The measured point of `precision` nearest to `micro` (the profile's own thread count).
const ProfilePoint* nearest(const ModelProfile& profile, int64_t micro, MixedPrecision precision) {
  const ProfilePoint* best = nullptr;
  for (const ProfilePoint& p : profile.points) {
    if (p.precision != precision || p.threads != profile.threads) continue;
    if (best == nullptr || std::llabs(p.micro_batch - micro) < std::llabs(best->micro_batch - micro)) best = &p;
  }
  return best;
}

// `t`'s memory with the measured profile's times at its size, or nothing when its kernels are
// not the measured steps'.
bool merged_point(const ModelProfile& measured, const ProfilePoint& t, ProfilePoint& out) {
  const ProfilePoint* near = nearest(measured, t.micro_batch, t.precision);
  if (near == nullptr) return false;
  const SharedTrace shared = shared_trace_for(measured, t.micro_batch, t.micro_batch, t.precision);
  const StepTrace& timed = *shared;
  if (timed.kernels.size() != t.trace.kernels.size()) return false;
  out = ProfilePoint{};
  out.micro_batch = t.micro_batch;
  out.precision = t.precision;
  out.threads = measured.threads;
  out.memory_traced = true;
  // Time: the measured points' line at this size, the kernels scaled to it as the profiler scales
  // a recorded step's kernels to its fastest step.
  out.forward_backward_ms = forward_backward_ms(measured, t.micro_batch, t.precision, measured.threads);
  out.optimizer_ms = near->optimizer_ms;
  out.step_ms = out.forward_backward_ms + out.optimizer_ms;
  out.trace = t.trace;
  double sum = 0;
  for (const TraceKernel& k : timed.kernels) sum += k.ms;
  const double scale = sum > 0 ? out.forward_backward_ms / sum : 0;
  for (size_t k = 0; k < out.trace.kernels.size(); ++k) out.trace.kernels[k].ms = timed.kernels[k].ms * scale;
  out.blocks = block_times(out.trace, near->blocks.size());
  // Memory: the trace's activations above what the measured points count as persistent (the
  // sampler's order too) and the batch; the optimizer's working bytes as measured.
  out.persistent_bytes = near->persistent_bytes;
  out.batch_bytes = batch_bytes(measured, t.micro_batch);
  out.forward_backward_peak_bytes = out.persistent_bytes + out.batch_bytes + t.activation_bytes();
  out.optimizer_peak_bytes = out.persistent_bytes + out.batch_bytes + optimizer_working_bytes(measured, t.precision);
  out.peak_bytes = std::max(out.forward_backward_peak_bytes, out.optimizer_peak_bytes);
  set_stage_terms(out);
  out.backward_read_buckets = t.backward_read_buckets;
  out.half_read_buckets = t.half_read_buckets;
  out.backward_copy_buckets = t.backward_copy_buckets;
  out.backward_fp32_buckets = t.backward_fp32_buckets;
  out.fp32_read_elements = t.fp32_read_elements;
  // Static plans' graph: the measured one interpolated (its kernels' costs are measured).
  out.graph = graph_for(measured, t.micro_batch, t.precision, &out.block_starts);
  return true;
}

// Empty when `precision`'s traces agree with every trained size they traced (and trace one at
// least), else why not.
std::string disagreement(const ModelProfile& measured, const ModelProfile& traced, MixedPrecision precision) {
  int compared = 0;
  for (const ProfilePoint& m : measured.points) {
    if (m.precision != precision || m.threads != measured.threads) continue;
    for (const ProfilePoint& t : traced.points) {
      if (t.precision != precision || t.micro_batch != m.micro_batch) continue;
      ++compared;
      const double off = static_cast<double>(t.activation_bytes() - m.activation_bytes()) /
                         static_cast<double>(std::max<int64_t>(1, m.activation_bytes()));
      if (std::abs(off) > kAgreement) {
        char why[160];
        std::snprintf(why, sizeof why, "%s: traced activations %+.1f%% off the trained step's at micro-batch %lld",
                      choice_name(precision), 100 * off, static_cast<long long>(m.micro_batch));
        return why;
      }
    }
  }
  return compared > 0 ? "" : std::string(choice_name(precision)) + ": no trained size traced";
}

}  // namespace

TracedPoints add_traced_points(ModelProfile& measured, const ModelProfile& traced) {
  TracedPoints out;
  std::set<MixedPrecision> precisions, agreed;
  for (const ProfilePoint& t : traced.points) precisions.insert(t.precision);
  for (MixedPrecision precision : precisions) {
    const std::string why = disagreement(measured, traced, precision);
    if (why.empty()) {
      agreed.insert(precision);
    } else {
      out.refused.push_back(why);
    }
  }
  std::vector<ProfilePoint> added;
  for (const ProfilePoint& t : traced.points) {
    if (agreed.count(t.precision) == 0 || measured_at(measured, t.micro_batch, t.precision)) continue;
    ProfilePoint point;
    if (merged_point(measured, t, point)) added.push_back(std::move(point));
  }
  out.added = static_cast<int>(added.size());
  for (ProfilePoint& p : added) measured.points.push_back(std::move(p));
  measured.recent_traces.clear();  // made from the points before these
  return out;
}

}  // namespace ht

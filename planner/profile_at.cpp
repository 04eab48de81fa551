#include "planner/profile_at.h"

#include "alloc/byte_size.h"

#include <algorithm>
#include <mutex>
#include <cmath>
#include <stdexcept>

namespace ht {
namespace {


// The two points to interpolate (or extrapolate) between for `m`: the pair around it, else the
// nearest pair. One point alone: itself twice.
std::pair<const ProfilePoint*, const ProfilePoint*> bracket(const std::vector<const ProfilePoint*>& points,
                                                            int64_t m) {
  if (points.size() == 1) return {points[0], points[0]};
  size_t hi = 1;
  while (hi + 1 < points.size() && points[hi]->micro_batch < m) ++hi;
  return {points[hi - 1], points[hi]};
}

// Affine in m through (a.m, ya) and (b.m, yb); proportional to m through one point.
double affine(int64_t m, const ProfilePoint& a, double ya, const ProfilePoint& b, double yb) {
  if (a.micro_batch == b.micro_batch) return ya * static_cast<double>(m) / static_cast<double>(a.micro_batch);
  const double slope = (yb - ya) / static_cast<double>(b.micro_batch - a.micro_batch);
  return ya + slope * static_cast<double>(m - a.micro_batch);
}



bool same_structure(const StepTrace& a, const StepTrace& b) {
  if (a.tensors.size() != b.tensors.size() || a.kernels.size() != b.kernels.size() ||
      a.events.size() != b.events.size())
    return false;
  for (size_t i = 0; i < a.events.size(); ++i) {
    if (a.events[i].kind != b.events[i].kind || a.events[i].index != b.events[i].index) return false;
  }
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    if (a.tensors[i].producer != b.tensors[i].producer) return false;
  }
  return true;
}

bool same_structure(const schedule::StepGraph& a, const schedule::StepGraph& b) {
  if (a.values.size() != b.values.size() || a.forward.size() != b.forward.size() ||
      a.backward.size() != b.backward.size())
    return false;
  for (size_t v = 0; v < a.values.size(); ++v) {
    if (a.values[v].producer != b.values[v].producer) return false;
  }
  for (size_t s = 0; s < a.backward.size(); ++s) {
    if (a.backward[s].forward_op != b.backward[s].forward_op) return false;
  }
  return true;
}

// Where the two points around `m` are not one step at two sizes (a trained point's trace beside
// a traced one's), the two nearest that are, so that every block (a backward temporary as much as
// an activation) is affine in the micro-batch; false, leaving a and b, where no two are.
bool nearest_matching_pair(const std::vector<const ProfilePoint*>& points, int64_t m, const ProfilePoint*& a,
                           const ProfilePoint*& b) {
  const auto distance = [&](const ProfilePoint* p) { return std::abs(p->micro_batch - m); };
  std::pair<int64_t, int64_t> best{-1, -1};
  for (size_t i = 0; i < points.size(); ++i) {
    for (size_t j = i + 1; j < points.size(); ++j) {
      if (points[i]->micro_batch == points[j]->micro_batch) continue;
      const std::pair<int64_t, int64_t> d{std::min(distance(points[i]), distance(points[j])),
                                          std::max(distance(points[i]), distance(points[j]))};
      if (best.first >= 0 && d >= best) continue;
      if (!same_structure(points[i]->trace, points[j]->trace)) continue;
      best = d;
      a = points[i];
      b = points[j];
    }
  }
  return best.first >= 0;
}

}  // namespace

// The points of `precision` measured with the profile's full thread count, by micro-batch.
std::vector<const ProfilePoint*> base_points(const ModelProfile& profile, MixedPrecision precision) {
  std::vector<const ProfilePoint*> out;
  for (const ProfilePoint& p : profile.points) {
    if (p.precision == precision && p.threads == profile.threads) out.push_back(&p);
  }
  if (out.empty()) throw std::invalid_argument(std::string("no profiled point at precision ") + choice_name(precision));
  std::sort(out.begin(), out.end(), [](const auto* a, const auto* b) { return a->micro_batch < b->micro_batch; });
  return out;
}

// Time at `threads` over time at the profile's threads, by Amdahl's law through the point
// measured with one thread (time = serial + parallel / threads). 1 without such a point.
double thread_factor(const ModelProfile& profile, int threads) {
  if (threads >= profile.threads || profile.threads <= 1) return 1.0;
  for (const ProfilePoint& one : profile.points) {
    if (one.threads != 1) continue;
    for (const ProfilePoint& full : profile.points) {
      if (full.threads != profile.threads || full.micro_batch != one.micro_batch || full.precision != one.precision)
        continue;
      const double a = full.forward_backward_ms, b = one.forward_backward_ms, T = profile.threads;
      const double parallel = std::max(0.0, (b - a) * T / (T - 1));
      const double serial = std::max(0.0, b - parallel);
      return (serial + parallel / threads) / a;
    }
  }
  return static_cast<double>(profile.threads) / threads;  // nothing measured: linear speedup
}

// Backward's share of forward and backward, from the blocks (2/3 when unknown).
double backward_share(const ProfilePoint& p) {
  double fwd = 0, bwd = 0;
  for (const BlockTime& b : p.blocks) {
    fwd += b.forward_ms;
    bwd += b.backward_ms;
  }
  return fwd + bwd > 0 ? bwd / (fwd + bwd) : 2.0 / 3.0;
}

double forward_backward_ms(const ModelProfile& profile, int64_t micro_batch, MixedPrecision precision,
                           int threads) {
  const auto points = base_points(profile, precision);
  const auto [a, b] = bracket(points, micro_batch);
  double ms = affine(micro_batch, *a, a->forward_backward_ms, *b, b->forward_backward_ms);
  // Below the smallest measured size a noisy fit can reach zero: a step costs at least its
  // share of the smallest measured one (small steps use the cores less well, not better).
  const ProfilePoint& least = *points.front();
  if (micro_batch < least.micro_batch) {
    ms = std::max(ms, least.forward_backward_ms * static_cast<double>(micro_batch) /
                          static_cast<double>(least.micro_batch));
  }
  return std::max(ms, 1e-3) * thread_factor(profile, threads);
}

int64_t activation_bytes(const ModelProfile& profile, int64_t micro_batch, MixedPrecision precision) {
  const auto [a, b] = bracket(base_points(profile, precision), micro_batch);
  const double bytes = affine(micro_batch, *a, static_cast<double>(a->activation_bytes()), *b,
                              static_cast<double>(b->activation_bytes()));
  return std::max<int64_t>(0, std::llround(bytes));
}

int64_t optimizer_working_bytes(const ModelProfile& profile, MixedPrecision precision) {
  int64_t bytes = 0;
  for (const ProfilePoint* q : base_points(profile, precision)) bytes = std::max(bytes, q->optimizer_working_bytes());
  return bytes;
}

namespace {

// The two traces `micro_batch` is read between: interpolated when they match op for op, else the
// nearer one's sizes and times scaled in proportion.
struct TracePair {
  const ProfilePoint* a;
  const ProfilePoint* b;
  const ProfilePoint* near;
  bool matched;
  double ratio;  // micro_batch over the nearer point's
};

TracePair trace_pair(const ModelProfile& profile, int64_t micro_batch, MixedPrecision precision) {
  const auto points = base_points(profile, precision);
  auto [a, b] = bracket(points, micro_batch);
  bool matched = a != b && same_structure(a->trace, b->trace);
  const bool profiled = a->micro_batch == micro_batch || b->micro_batch == micro_batch;
  if (!matched && !profiled) matched = nearest_matching_pair(points, micro_batch, a, b);
  const ProfilePoint* near = std::abs(a->micro_batch - micro_batch) <= std::abs(b->micro_batch - micro_batch) ? a : b;
  return {a, b, near, matched, static_cast<double>(micro_batch) / static_cast<double>(near->micro_batch)};
}

// Kernel k's measured and modelled times at `micro_batch`.
void time_kernel(TraceKernel& kernel, size_t k, const TracePair& p, int64_t micro_batch) {
  const ProfilePoint &a = *p.a, &b = *p.b;
  kernel.ms = p.matched ? std::max(0.0, affine(micro_batch, a, a.trace.kernels[k].ms, b, b.trace.kernels[k].ms))
                        : kernel.ms * p.ratio;
  kernel.modeled_ms = p.matched ? std::max(0.0, affine(micro_batch, a, a.trace.kernels[k].modeled_ms, b,
                                                       b.trace.kernels[k].modeled_ms))
                                : kernel.modeled_ms * p.ratio;
}

// The trace of trace_for, made anew: the nearer point's trace, resized.
StepTrace make_trace(const ModelProfile& profile, int64_t micro_batch, int64_t local_batch, MixedPrecision precision) {
  const TracePair p = trace_pair(profile, micro_batch, precision);
  StepTrace out = p.near->trace;
  for (size_t i = 0; i < out.tensors.size(); ++i) {
    TraceTensor& t = out.tensors[i];
    if (p.matched) {
      t.bytes = std::max<int64_t>(1, std::llround(affine(micro_batch, *p.a, p.a->trace.tensors[i].bytes, *p.b,
                                                          p.b->trace.tensors[i].bytes)));
    } else if (t.low_end) {
      t.bytes = std::max<int64_t>(1, std::llround(t.bytes * p.ratio));
    }
  }
  for (size_t k = 0; k < out.kernels.size(); ++k) time_kernel(out.kernels[k], k, p, micro_batch);
  // The batch: what the step allocates before its first kernel, for the rank's whole share.
  const double batch_ratio = static_cast<double>(local_batch) / static_cast<double>(micro_batch);
  for (const TraceEvent& e : out.events) {
    if (e.kind == TraceEvent::Kind::kKernelBegins) break;
    if (e.kind == TraceEvent::Kind::kAllocated) {
      TraceTensor& t = out.tensors[static_cast<size_t>(e.index)];
      t.bytes = std::llround(t.bytes * batch_ratio);
    }
  }
  return out;
}

std::mutex g_recent_traces_mutex;
// As many as a few threads working on neighbouring plans reach back for (26 MB each at 70B).
constexpr size_t kRecentTraces = 8;

}  // namespace

SharedTrace shared_trace_for(const ModelProfile& profile, int64_t micro_batch, int64_t local_batch,
                             MixedPrecision precision) {
  std::vector<ModelProfile::RecentTrace>& recent = profile.recent_traces;
  const int p = static_cast<int>(precision);
  {
    const std::lock_guard<std::mutex> lock(g_recent_traces_mutex);
    for (size_t i = 0; i < recent.size(); ++i) {
      if (recent[i].micro_batch != micro_batch || recent[i].local_batch != local_batch || recent[i].precision != p) continue;
      ModelProfile::RecentTrace hit = recent[i];
      recent.erase(recent.begin() + static_cast<std::ptrdiff_t>(i));
      recent.push_back(hit);  // the most recent last
      return hit.trace;
    }
  }
  auto made = std::make_shared<const StepTrace>(make_trace(profile, micro_batch, local_batch, precision));
  const std::lock_guard<std::mutex> lock(g_recent_traces_mutex);
  recent.push_back({micro_batch, local_batch, p, made});
  if (recent.size() > kRecentTraces) recent.erase(recent.begin());
  return made;
}

StepTrace trace_for(const ModelProfile& profile, int64_t micro_batch, int64_t local_batch, MixedPrecision precision) {
  return *shared_trace_for(profile, micro_batch, local_batch, precision);
}

std::vector<KernelTime> kernel_times(const ModelProfile& profile, int64_t micro_batch, MixedPrecision precision) {
  const TracePair p = trace_pair(profile, micro_batch, precision);
  const std::vector<TraceKernel>& kernels = p.near->trace.kernels;
  std::vector<KernelTime> out;
  out.reserve(kernels.size());
  for (size_t k = 0; k < kernels.size(); ++k) {
    TraceKernel timed;  // its times alone: the copy of a kernel's reads is what makes a trace slow
    timed.ms = kernels[k].ms;
    timed.modeled_ms = kernels[k].modeled_ms;
    time_kernel(timed, k, p, micro_batch);
    out.push_back({kernels[k].op, kernels[k].backward, timed.ms});
  }
  return out;
}

schedule::StepGraph graph_for(const ModelProfile& profile, int64_t micro_batch, MixedPrecision precision,
                              std::vector<int>* block_starts) {
  const auto [a, b] = bracket(base_points(profile, precision), micro_batch);
  const ProfilePoint& near =
      std::abs(a->micro_batch - micro_batch) <= std::abs(b->micro_batch - micro_batch) ? *a : *b;
  schedule::StepGraph out = near.graph;
  if (block_starts != nullptr) *block_starts = near.block_starts;
  const bool matched = a != b && same_structure(a->graph, b->graph);
  const double ratio = static_cast<double>(micro_batch) / static_cast<double>(near.micro_batch);
  // Affine between the two points when they match value for value, else proportional to the nearer.
  auto scaled = [&](double mine, double at_a, double at_b) {
    return std::max(0.0, matched ? affine(micro_batch, *a, at_a, *b, at_b) : mine * ratio);
  };
  for (size_t v = 0; v < out.values.size(); ++v) {
    const double bytes = scaled(static_cast<double>(out.values[v].bytes), static_cast<double>(a->graph.values[v].bytes),
                                matched ? static_cast<double>(b->graph.values[v].bytes) : 0);
    out.values[v].bytes = arena_bytes(std::llround(bytes));
  }
  for (size_t k = 0; k < out.forward.size(); ++k) {
    schedule::ForwardOp& op = out.forward[k];
    op.cost_ms = scaled(op.cost_ms, a->graph.forward[k].cost_ms, matched ? b->graph.forward[k].cost_ms : 0);
    op.modeled_ms = scaled(op.modeled_ms, a->graph.forward[k].modeled_ms, matched ? b->graph.forward[k].modeled_ms : 0);
    op.working_bytes = std::llround(scaled(static_cast<double>(op.working_bytes),
                                           static_cast<double>(a->graph.forward[k].working_bytes),
                                           matched ? static_cast<double>(b->graph.forward[k].working_bytes) : 0));
  }
  for (size_t s = 0; s < out.backward.size(); ++s) {
    schedule::BackwardStage& stage = out.backward[s];
    stage.working_bytes = std::llround(scaled(static_cast<double>(stage.working_bytes),
                                              static_cast<double>(a->graph.backward[s].working_bytes),
                                              matched ? static_cast<double>(b->graph.backward[s].working_bytes) : 0));
  }
  return out;
}

int threads_per_rank(const Machine& machine, int ranks_on_node) {
  if (!machine.shared_host) return machine.host_threads;
  if (machine.rank_threads > 0) return machine.rank_threads;
  return std::max(1, machine.host_threads / std::max(1, ranks_on_node));
}

double oversubscription(const Machine& machine, int ranks_on_node) {
  if (!machine.shared_host) return 1.0;
  // Against one rank, as the profile measured it (a rank of more threads than the host's already
  // took turns there).
  const int per_rank = threads_per_rank(machine, ranks_on_node);
  const int threads = std::max(1, ranks_on_node) * per_rank;
  const int room = std::max({1, machine.host_threads, per_rank});
  return threads <= room ? 1.0 : static_cast<double>(threads) / room;
}

double allreduce_ms(const Machine& machine, int ranks, int64_t bytes, int stride) {
  if (ranks <= 1) return 0;
  const RingLink link = ring_link(machine, ranks, stride);
  const double steps = 2.0 * (ranks - 1);
  const double chunk = static_cast<double>(bytes) / ranks;
  return steps * (link.latency_us * 1e-3 + chunk / (link.gbps * 1e9) * 1e3);
}

int64_t batch_bytes(const ModelProfile& profile, int64_t samples) {
  return arena_bytes(samples * profile.input_sample_bytes) +
         arena_bytes(samples * profile.target_sample_bytes);
}

}  // namespace ht

#include "planner/gradient_blocks.h"

#include "parallel/shard_layout.h"
#include "planner/shard_terms.h"
#include "planner/trace_derived.h"
#include "planner/weight_copy_terms.h"

#include <algorithm>
#include <mutex>
#include <tuple>

namespace ht {

bool bf16_gradients(const Plan& plan) { return keeps_bf16_gradients(plan.gradient_dtype, plan.precision); }

int64_t gradient_element_bytes(const ModelProfile& profile, const Plan& plan) {
  if (bf16_gradients(plan)) return 2;
  return profile.parameters > 0 ? profile.gradient_bytes / profile.parameters : 4;
}

int64_t gradient_block_bytes(const ModelProfile& profile, const Plan& plan) {
  return bf16_gradients(plan) ? arena_bytes(2 * profile.parameters) : profile.gradient_bytes;
}

std::optional<Plan> bf16_gradients_twin(const Plan& plan) {
  // One micro-batch a step only: each gradient is then rounded to bf16 once (a reduction sums the
  // ranks' in fp32 and rounds once), as a bf16 reduce-scatter would round it. With accumulation
  // the running sum would be kept in bf16, which a search does not choose for a user.
  if (plan.gradient_dtype != GradientDtype::kAuto || plan.precision != MixedPrecision::kBf16 || plan.accumulation > 1)
    return std::nullopt;
  Plan twin = plan;
  twin.gradient_dtype = GradientDtype::kBf16;
  return twin;
}
namespace {

// Who allocated each tensor: `backward`, by backward (a backward kernel, or between kernels once
// backward began), not by a forward kernel (a regeneration's included); `kernel`, the innermost
// kernel running then (-1: none).
struct Makers {
  std::vector<char> backward;
  std::vector<int> kernel;
};

Makers makers(const StepTrace& trace, size_t end) {
  Makers m{std::vector<char>(trace.tensors.size(), 0), std::vector<int>(trace.tensors.size(), -1)};
  std::vector<int> open;
  bool backward = false;
  for (size_t i = 0; i < end; ++i) {
    const TraceEvent& e = trace.events[i];
    const auto t = static_cast<size_t>(e.index);
    if (e.kind == TraceEvent::Kind::kKernelBegins) {
      open.push_back(e.index);
      backward = backward || trace.kernels[t].backward;
    } else if (e.kind == TraceEvent::Kind::kKernelEnds) {
      auto it = std::find(open.rbegin(), open.rend(), e.index);
      if (it != open.rend()) open.erase(std::next(it).base());
    } else if (e.kind == TraceEvent::Kind::kAllocated) {
      m.kernel[t] = open.empty() ? -1 : open.back();
      m.backward[t] = open.empty() ? backward : trace.kernels[static_cast<size_t>(open.back())].backward;
    }
  }
  return m;
}

// After the kernel ending at event `ends`: the first event past the tape's frees of what the
// kernel did not make (the gradient it was given), where it copies the kernel's parameter
// gradients into their slots before freeing them (runtime/tape.cpp).
size_t after_given_frees(const StepTrace& trace, const Makers& made_by, size_t ends, size_t end) {
  const int kernel = trace.events[ends].index;
  size_t j = ends + 1;
  while (j < end && trace.events[j].kind == TraceEvent::Kind::kFreed &&
         made_by.kernel[static_cast<size_t>(trace.events[j].index)] != kernel)
    ++j;
  return j;
}

// Where each bucket's block comes and goes along the trace (its bytes are bucket_bytes').
BucketTimes bucket_positions(const ModelProfile& profile, const StepTrace& trace, size_t end) {
  const size_t buckets = profile.block_buckets.size();
  BucketTimes t;
  t.first.assign(buckets, BucketTimes::kNone);
  t.ready.assign(buckets, end);
  t.made_at.assign(buckets, end);
  const Makers made_by = makers(trace, end);
  std::vector<size_t> last(buckets, BucketTimes::kNone);
  for (size_t i = 0; i < end; ++i) {
    const TraceEvent& e = trace.events[i];
    if (e.kind != TraceEvent::Kind::kKernelEnds) continue;
    for (int b : trace.kernels[static_cast<size_t>(e.index)].gradient_buckets) {
      if (b < 0 || static_cast<size_t>(b) >= buckets) continue;
      if (t.first[static_cast<size_t>(b)] == BucketTimes::kNone) {
        t.first[static_cast<size_t>(b)] = i;
        // The tape lets go of the gradient the kernel was given, then adds the kernel's gradients
        // up: the block is made there, before it frees what the kernel made (runtime/tape.cpp).
        t.made_at[static_cast<size_t>(b)] = after_given_frees(trace, made_by, i, end);
      }
      last[static_cast<size_t>(b)] = i;
    }
  }
  size_t done = 0;  // the last gradient of this bucket and every bucket before it
  for (size_t b = 0; b < buckets; ++b) {
    done = last[b] == BucketTimes::kNone || done == BucketTimes::kNone ? BucketTimes::kNone : std::max(done, last[b]);
    if (done != BucketTimes::kNone) {
      // The tape frees the gradient the kernel was given and the parameters' gradients it copied
      // into their slots before it tells GradientShards they are in; what the kernel saved goes
      // after (runtime/tape.cpp).
      size_t j = done + 1;
      while (j < end && trace.events[j].kind == TraceEvent::Kind::kFreed &&
             made_by.backward[static_cast<size_t>(trace.events[j].index)])
        ++j;
      t.ready[b] = std::min(std::max(done + 1, j - 1), end);
    }
  }
  return t;
}

// Each bucket's block bytes, arena-rounded, of elements of `element_bytes`.
void bucket_bytes(const ModelProfile& profile, int64_t element_bytes, BucketTimes& t) {
  t.bytes.clear();
  for (const std::vector<int64_t>& members : profile.block_buckets) {
    int64_t n = 0;
    for (int64_t elements : members) n += elements;
    t.bytes.push_back(arena_bytes(element_bytes * n));
  }
}

// The blocks and parts of `t` as the walk meets them (gradient_block_steps).
GradientBlockSteps steps_of(const BucketTimes& t, size_t end, bool overlapped, const std::vector<int64_t>& part_bytes) {
  GradientBlockSteps s;
  s.end = end;
  // The block comes before the reduce-scatter its gradient completes; overlapped, a start waits
  // for the one before (its block and part go) and gives the new one a part of its shard's size
  // (a micro-batch after the first). The last kernel's gradients are accumulated after it (index
  // `end`), while the reduce-scatter before them may still be under way.
  const size_t buckets = t.first.size();
  for (size_t b = 0; b < buckets; ++b) {
    const int64_t part = overlapped && b < part_bytes.size() ? part_bytes[b] : 0;
    const size_t freed = !overlapped ? t.ready[b] : b + 1 < buckets ? t.ready[b + 1] : end;
    s.started.add(t.ready[b], part);
    s.started.add(freed, -part);
    if (t.first[b] == BucketTimes::kNone) continue;
    s.made.add(t.made_at[b], t.bytes[b]);
    s.started.add(freed, -t.bytes[b]);
  }
  s.made.sort();
  s.started.sort();
  return s;
}

}  // namespace

void EventDeltas::sort() {
  std::stable_sort(deltas_.begin(), deltas_.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  next_ = 0;
}

// One past the last kernel's end: forward and backward (the optimizer's temporaries after it are
// its phase's).
size_t forward_backward_end(const StepTrace& trace) {
  size_t end = 0;
  for (size_t i = 0; i < trace.events.size(); ++i) {
    if (trace.events[i].kind == TraceEvent::Kind::kKernelEnds) end = i + 1;
  }
  return end;
}

GradientBlockSteps gradient_block_steps(const ModelProfile& profile, const StepTrace& trace, int64_t element_bytes,
                                        bool overlapped, const std::vector<int64_t>& part_bytes) {
  const size_t end = forward_backward_end(trace);
  BucketTimes t = bucket_positions(profile, trace, end);
  bucket_bytes(profile, element_bytes, t);
  return steps_of(t, end, overlapped, part_bytes);
}

int64_t trailing_frees(const StepTrace& trace, size_t end) {
  int64_t bytes = 0;
  for (size_t j = end; j < trace.events.size() && trace.events[j].kind == TraceEvent::Kind::kFreed; ++j)
    bytes += trace.tensors[static_cast<size_t>(trace.events[j].index)].bytes;
  return bytes;
}

StepFold fold_step(const ModelProfile& profile, const StepTrace& trace) {
  StepFold f;
  f.end = forward_backward_end(trace);
  if (!profile.block_buckets.empty()) f.times = bucket_positions(profile, trace, f.end);
  std::vector<size_t> at{f.end};
  for (const std::vector<size_t>* where : {&f.times.ready, &f.times.made_at})
    for (size_t i : *where)
      if (i <= f.end) at.push_back(i);
  for (size_t i = 0; i < f.end; ++i)
    if (trace.events[i].kind == TraceEvent::Kind::kKernelBegins) at.push_back(i);
  std::sort(at.begin(), at.end());
  at.erase(std::unique(at.begin(), at.end()), at.end());
  f.at = std::move(at);
  size_t next = 0;  // the first event not yet folded
  for (size_t a : f.at) {
    int64_t change = 0, rise = StepFold::kNoRise;
    for (size_t i = next; i < a; ++i) {
      const TraceEvent& e = trace.events[i];
      if (e.kind == TraceEvent::Kind::kAllocated) change += trace.tensors[static_cast<size_t>(e.index)].bytes;
      if (e.kind == TraceEvent::Kind::kFreed) change -= trace.tensors[static_cast<size_t>(e.index)].bytes;
      rise = std::max(rise, change);
    }
    f.rise.push_back(rise);
    f.change.push_back(change);
    next = a + 1;
  }
  f.trailing = trailing_frees(trace, f.end);
  return f;
}

std::shared_ptr<const StepFold> shared_step_fold(const ModelProfile& profile, const SharedTrace& trace) {
  static std::mutex mutex;  // plans are predicted on several threads (search.cpp)
  // 8: a search's traces, and each without its weights' casts.
  return derived_from(profile.step_folds, mutex, trace, 8, [&] { return fold_step(profile, *trace); });
}

GradientBlockSteps gradient_block_steps(const ModelProfile& profile, const StepFold& fold, int64_t element_bytes,
                                        bool overlapped, const std::vector<int64_t>& part_bytes) {
  BucketTimes t = fold.times;
  bucket_bytes(profile, element_bytes, t);
  return steps_of(t, fold.end, overlapped, part_bytes);
}

int64_t walk_above_peak(const StepTrace& trace, const StepFold& fold, GradientBlockSteps& steps,
                        const std::function<int64_t(const TraceKernel&)>& held_at) {
  int64_t in_use = 0, peak = 0, top = 0, held = 0, blocks = 0;
  auto count = [&] { top = std::max(top, in_use + held + blocks); };
  for (size_t k = 0; k < fold.at.size(); ++k) {
    // The events before it, none of which changes what the walk adds: their highest point.
    if (fold.rise[k] != StepFold::kNoRise) {
      peak = std::max(peak, in_use + fold.rise[k]);
      top = std::max(top, in_use + fold.rise[k] + held + blocks);
      in_use += fold.change[k];
    }
    const size_t i = fold.at[k];
    // A block is made where the tape copies the kernel's gradient into it, before it frees that.
    blocks += steps.made.take(i);
    count();
    if (i == fold.end) {
      in_use -= fold.trailing;
    } else if (const TraceEvent& e = trace.events[i]; e.kind == TraceEvent::Kind::kKernelBegins) {
      held = held_at(trace.kernels[static_cast<size_t>(e.index)]);
    } else if (e.kind == TraceEvent::Kind::kAllocated) {
      in_use += trace.tensors[static_cast<size_t>(e.index)].bytes;
    } else if (e.kind == TraceEvent::Kind::kFreed) {
      in_use -= trace.tensors[static_cast<size_t>(e.index)].bytes;
    }
    peak = std::max(peak, in_use);
    count();
    // The releases and parts at i: the part is made after the block before is freed, so a start
    // never adds more than it frees but at the first bucket's.
    blocks += steps.started.take(i);
    count();
  }
  return top - peak;
}

int64_t gradient_blocks_above_peak(const ModelProfile& profile, const StepTrace& trace, int64_t element_bytes,
                                   bool overlapped, const std::vector<int64_t>& part_bytes) {
  if (profile.block_buckets.empty() || trace.events.empty()) return -1;
  return gradient_blocks_above_peak(profile, trace, fold_step(profile, trace), element_bytes, overlapped, part_bytes);
}

int64_t gradient_blocks_above_peak(const ModelProfile& profile, const StepTrace& trace, const StepFold& fold,
                                   int64_t element_bytes, bool overlapped, const std::vector<int64_t>& part_bytes) {
  if (profile.block_buckets.empty() || trace.events.empty()) return -1;
  GradientBlockSteps steps = gradient_block_steps(profile, fold, element_bytes, overlapped, part_bytes);
  return walk_above_peak(trace, fold, steps, [](const TraceKernel&) { return int64_t{0}; });
}

std::vector<int64_t> reduce_scatter_parts(const ModelProfile& profile, const Plan& plan) {
  const int64_t element = gradient_element_bytes(profile, plan);
  std::vector<int64_t> parts;  // the fullest rank's (rank 0's) shard of each bucket
  if (plan.accumulation > 1)
    for (const std::vector<int64_t>& members : profile.block_buckets)
      parts.push_back(arena_bytes(element * shard_bucket(members, plan.weight_replicas()).counts[0]));
  return parts;
}

int64_t gradient_blocks_term(const ModelProfile& profile, const Plan& plan, const StepTrace& trace) {
  const int64_t element = gradient_element_bytes(profile, plan);
  return gradient_blocks_above_peak(profile, trace, element, reduce_scatters_overlap(plan),
                                    reduce_scatter_parts(profile, plan));
}

int64_t gradient_blocks_term(const ModelProfile& profile, const Plan& plan, const TraceMaker& step) {
  static std::mutex mutex;  // plans are predicted on several threads (search.cpp)
  const bool uncast = walks_without_casts(plan);
  const auto key = std::make_tuple(plan.micro_batch, static_cast<int>(plan.precision), reduce_scatters_overlap(plan),
                                   plan.accumulation > 1 ? plan.weight_replicas() : 0, uncast, bf16_gradients(plan));
  {
    const std::lock_guard<std::mutex> lock(mutex);
    auto it = profile.gradient_block_walks.find(key);
    if (it != profile.gradient_block_walks.end()) return it->second;
  }
  // Kept copies: the step without the weights' casts and their fp32 gradients, as it runs.
  const SharedTrace trace = uncast ? shared_without_weight_casts(profile, step()) : step();
  const int64_t walked = gradient_blocks_above_peak(profile, *trace, *shared_step_fold(profile, trace),
                                                    gradient_element_bytes(profile, plan), reduce_scatters_overlap(plan),
                                                    reduce_scatter_parts(profile, plan));
  const std::lock_guard<std::mutex> lock(mutex);
  profile.gradient_block_walks.emplace(key, walked);
  return walked;
}

int64_t kept_gradients_above_peak(const StepTrace& trace) {
  if (trace.events.empty()) return -1;
  const size_t end = forward_backward_end(trace);
  const Makers made_by = makers(trace, end);
  // The frees the tape makes of what a kernel giving parameters' gradients made, right after it
  // ends and lets go of the gradient it was given: its gradients, copied into the block.
  std::vector<char> copied(end, 0);
  for (size_t i = 0; i < end; ++i) {
    const TraceEvent& e = trace.events[i];
    if (e.kind != TraceEvent::Kind::kKernelEnds) continue;
    const TraceKernel& k = trace.kernels[static_cast<size_t>(e.index)];
    if (!k.backward || k.gradient_buckets.empty()) continue;
    size_t j = after_given_frees(trace, made_by, i, end);
    for (; j < end && trace.events[j].kind == TraceEvent::Kind::kFreed &&
           made_by.kernel[static_cast<size_t>(trace.events[j].index)] == e.index;
         ++j)
      copied[j] = 1;
  }
  int64_t in_use = 0, kept = 0, peak = 0, with_kept = 0;
  for (size_t i = 0; i < end; ++i) {
    const TraceEvent& e = trace.events[i];
    const int64_t bytes = e.kind == TraceEvent::Kind::kAllocated || e.kind == TraceEvent::Kind::kFreed
                              ? trace.tensors[static_cast<size_t>(e.index)].bytes
                              : 0;
    if (e.kind == TraceEvent::Kind::kAllocated) in_use += bytes;
    if (e.kind == TraceEvent::Kind::kFreed) {
      in_use -= bytes;
      if (copied[i]) kept += bytes;
    }
    peak = std::max(peak, in_use);
    with_kept = std::max(with_kept, in_use + kept);
  }
  return with_kept - peak;
}

bool keeps_gradients_as_made(const Plan& plan) {
  return plan.weight_replicas() == 1 && plan.budget_bytes == 0 && plan.accumulation == 1 && plan.stages == 1 &&
         !bf16_gradients(plan);
}

int64_t kept_gradients_term(const ModelProfile& profile, const Plan& plan, const TraceMaker& step) {
  static std::mutex mutex;  // plans are predicted on several threads (search.cpp)
  const auto key = std::make_pair(plan.micro_batch, static_cast<int>(plan.precision));
  {
    const std::lock_guard<std::mutex> lock(mutex);
    auto it = profile.kept_gradient_walks.find(key);
    if (it != profile.kept_gradient_walks.end()) return it->second;
  }
  const int64_t walked = kept_gradients_above_peak(*step());
  const std::lock_guard<std::mutex> lock(mutex);
  profile.kept_gradient_walks.emplace(key, walked);
  return walked;
}

void kept_gradient_terms(const ModelProfile& profile, const Plan& plan, Prediction& p) {
  const int64_t above = kept_gradients_term(profile, plan, [&] {
    return shared_trace_for(profile, plan.micro_batch, plan.micro_batch * plan.accumulation, plan.precision);
  });
  if (above < 0) return;
  // Gradients kept above the working set replace the whole gradient block's bytes in the peak.
  const int64_t without_gradients = p.fixed_bytes() - p.gradient_bytes;
  p.peak_bytes = std::max(without_gradients + p.activation_bytes + std::min(above, p.gradient_bytes),
                          p.fixed_bytes() + p.optimizer_working_bytes);
}

}  // namespace ht

#include "planner/gradient_blocks.h"

#include "parallel/shard_layout.h"
#include "planner/shard_terms.h"

#include <algorithm>
#include <mutex>
#include <tuple>

namespace ht {
namespace {

// When each bucket's gradient block (cut at blocks) comes and goes along the trace: `first`, the
// end of the first kernel that makes one of its gradients (kNone: no kernel makes one), and, as
// the tape does it, where its block is made and where its reduce-scatter starts.
struct BucketTimes {
  static constexpr size_t kNone = static_cast<size_t>(-1);
  std::vector<size_t> first;
  // Where the bucket becomes ready (GradientShards starts it when the tape says its last gradient
  // is in): after the kernel that gives its last gradient (and every earlier bucket's) ends and
  // the tape frees the gradients it added up, before what the kernel read goes; `end` where none does.
  std::vector<size_t> ready;
  // Where its block is made (counted before that event): after the first gradient's kernel ends
  // and the frees of what it read, before the frees of what it made.
  std::vector<size_t> made_at;
  std::vector<int64_t> bytes;  // the block's, arena-rounded
};

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

BucketTimes bucket_times(const ModelProfile& profile, const StepTrace& trace, size_t end, int64_t element_bytes) {
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
    int64_t n = 0;
    for (int64_t elements : profile.block_buckets[b]) n += elements;
    t.bytes.push_back(arena_bytes(element_bytes * n));
  }
  return t;
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
  GradientBlockSteps s;
  s.end = forward_backward_end(trace);
  const size_t end = s.end;
  const BucketTimes t = bucket_times(profile, trace, end, element_bytes);
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

int64_t trailing_frees(const StepTrace& trace, size_t end) {
  int64_t bytes = 0;
  for (size_t j = end; j < trace.events.size() && trace.events[j].kind == TraceEvent::Kind::kFreed; ++j)
    bytes += trace.tensors[static_cast<size_t>(trace.events[j].index)].bytes;
  return bytes;
}

int64_t gradient_blocks_above_peak(const ModelProfile& profile, const StepTrace& trace, int64_t element_bytes,
                                   bool overlapped, const std::vector<int64_t>& part_bytes) {
  if (profile.block_buckets.empty() || trace.events.empty()) return -1;
  GradientBlockSteps s = gradient_block_steps(profile, trace, element_bytes, overlapped, part_bytes);
  int64_t in_use = 0, peak = 0, blocks = 0, with_blocks = 0;
  for (size_t i = 0; i <= s.end; ++i) {
    // A block is made where the tape copies the kernel's gradient into it, before it frees that.
    blocks += s.made.take(i);
    with_blocks = std::max(with_blocks, in_use + blocks);
    if (i < s.end) {
      const TraceEvent& e = trace.events[i];
      if (e.kind == TraceEvent::Kind::kAllocated) in_use += trace.tensors[static_cast<size_t>(e.index)].bytes;
      if (e.kind == TraceEvent::Kind::kFreed) in_use -= trace.tensors[static_cast<size_t>(e.index)].bytes;
    } else {
      in_use -= trailing_frees(trace, s.end);
    }
    peak = std::max(peak, in_use);
    with_blocks = std::max(with_blocks, in_use + blocks);
    // The releases and parts at i: the part is made after the block before is freed, so a start
    // never adds more than it frees but at the first bucket's.
    blocks += s.started.take(i);
    with_blocks = std::max(with_blocks, in_use + blocks);
  }
  return with_blocks - peak;
}

std::vector<int64_t> reduce_scatter_parts(const ModelProfile& profile, const Plan& plan) {
  const int64_t element = profile.parameters > 0 ? profile.gradient_bytes / profile.parameters : 4;
  std::vector<int64_t> parts;  // the fullest rank's (rank 0's) shard of each bucket
  if (plan.accumulation > 1)
    for (const std::vector<int64_t>& members : profile.block_buckets)
      parts.push_back(arena_bytes(element * shard_bucket(members, plan.ranks).counts[0]));
  return parts;
}

int64_t gradient_blocks_term(const ModelProfile& profile, const Plan& plan, const StepTrace& trace) {
  const int64_t element = profile.parameters > 0 ? profile.gradient_bytes / profile.parameters : 4;
  return gradient_blocks_above_peak(profile, trace, element, reduce_scatters_overlap(plan),
                                    reduce_scatter_parts(profile, plan));
}

int64_t gradient_blocks_term(const ModelProfile& profile, const Plan& plan, const TraceMaker& step) {
  static std::mutex mutex;  // plans are predicted on several threads (search.cpp)
  const auto key = std::make_tuple(plan.micro_batch, static_cast<int>(plan.precision), reduce_scatters_overlap(plan),
                                   plan.accumulation > 1 ? plan.ranks : 0);
  {
    const std::lock_guard<std::mutex> lock(mutex);
    auto it = profile.gradient_block_walks.find(key);
    if (it != profile.gradient_block_walks.end()) return it->second;
  }
  const int64_t walked = gradient_blocks_term(profile, plan, *step());
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
  return plan.ranks == 1 && plan.budget_bytes == 0 && plan.accumulation == 1 && plan.stages == 1;
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

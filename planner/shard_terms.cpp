#include "planner/shard_terms.h"

#include "parallel/shard_layout.h"
#include "planner/gradient_blocks.h"
#include "planner/repeated_layers.h"
#include "planner/weight_copy_terms.h"

#include <algorithm>
#include <optional>
#include <mutex>
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

double allgather_ms(const Machine& machine, int ranks, int64_t bytes, int stride) {
  if (ranks <= 1) return 0;
  const RingLink link = ring_link(machine, ranks, stride);
  const double chunk = static_cast<double>(bytes) / ranks;
  return (ranks - 1) * (link.latency_us * 1e-3 + chunk / (link.gbps * 1e9) * 1e3);
}

const std::vector<std::vector<int64_t>>& sharded_buckets(const ModelProfile& profile, ShardLevel level) {
  return level >= ShardLevel::kGradients && !profile.block_buckets.empty() ? profile.block_buckets : profile.buckets;
}

namespace {

// The buckets cut at blocks, their bytes, who reads them, and what backward reads again.
struct BlockBuckets {
  // Per bucket, its collectives: one, or under 16-bit copies the copies' and the fp32 reads'
  // (parallel/parameter_shards.h: a weight read in fp32 is gathered alone; priced as one), each
  // arena-rounded, and whether backward gathers it again.
  struct Part {
    int64_t bytes = 0;
    bool read_back = false;
  };
  std::vector<std::vector<Part>> parts;
  std::vector<int64_t> bytes;                // per bucket, its parts' bytes
  const std::vector<std::vector<size_t>>* uses = nullptr;  // per block, the buckets it reads
  std::vector<int> readers;                  // per bucket, the blocks that read it
  std::vector<bool> read_back;               // per bucket: backward reads a part of it again

  // `copies`: the profile point whose reads 16-bit gathers follow (null: fp32 buckets, gathered
  // again in backward where `backward_reads` holds them, all where it is null).
  BlockBuckets(const ModelProfile& profile, int64_t element_bytes, const std::vector<size_t>* backward_reads,
               const ProfilePoint* copies = nullptr)
      : uses(&profile.block_bucket_uses), readers(profile.block_buckets.size(), 0),
        read_back(profile.block_buckets.size(), false) {
    const size_t n_buckets = profile.block_buckets.size();
    // Which buckets hold what, and what of it backward reads again: under copies, the copies whose
    // casts the traced step saved (a first layer's product, whose input needs no gradient, saves
    // none) and the weights read in fp32 that it saved (a norm's gain; not a tied table, which the
    // lookup does not save); otherwise the buckets of the weights backward read.
    std::vector<bool> half(n_buckets, false), half_back(n_buckets, false), fp32_back(n_buckets, copies == nullptr);
    std::vector<int64_t> fp32(n_buckets, 0);
    auto mark = [&](const std::vector<size_t>& list, std::vector<bool>& flags) {
      for (size_t b : list)
        if (b < n_buckets) flags[b] = true;
    };
    if (copies != nullptr) {
      mark(copies->half_read_buckets, half);
      mark(copies->backward_copy_buckets, half_back);
      mark(copies->backward_fp32_buckets, fp32_back);
      for (const auto& [b, n] : copies->fp32_read_elements)
        if (b < n_buckets) fp32[b] = n;
    } else if (backward_reads != nullptr) {
      std::fill(fp32_back.begin(), fp32_back.end(), false);
      mark(*backward_reads, fp32_back);
    }
    for (size_t b = 0; b < n_buckets; ++b) {
      int64_t n = 0;
      for (int64_t e : profile.block_buckets[b]) n += e;
      std::vector<Part> ps;
      if (copies == nullptr) {
        ps.push_back({arena_bytes(element_bytes * n), fp32_back[b]});
      } else {
        if (half[b]) ps.push_back({arena_bytes(2 * n), half_back[b]});
        if (fp32[b] > 0) ps.push_back({arena_bytes(4 * fp32[b]), fp32_back[b]});
      }
      int64_t sum = 0;
      for (const Part& x : ps) {
        sum += x.bytes;
        if (x.read_back) read_back[b] = true;
      }
      bytes.push_back(sum);
      parts.push_back(std::move(ps));
    }
    for (const std::vector<size_t>& u : *uses)
      for (size_t b : u) ++readers[b];
  }
  // Bucket `b`'s bytes gathered in forward, or again in backward.
  int64_t bytes_of(size_t b, bool backward) const {
    if (!backward) return bytes[b];
    int64_t n = 0;
    for (const Part& x : parts[b])
      if (x.read_back) n += x.bytes;
    return n;
  }
  bool empty() const { return bytes.empty() || uses->empty(); }
  // Whether block `j` reads any bucket (in backward: any it reads again).
  bool reads(size_t j, bool backward) const {
    for (size_t b : (*uses)[j])
      if (!backward || read_back[b]) return true;
    return false;
  }
  // Bytes of the buckets `blocks` read (in backward: those read again), and of the tied ones
  // (several blocks read them: held from their first read in backward to its end).
  int64_t held(const std::vector<size_t>& blocks, bool backward) const {
    int64_t n = 0;
    for (size_t b = 0; b < bytes.size(); ++b) {
      bool in = backward && readers[b] > 1;
      for (size_t j : blocks) in = in || std::find((*uses)[j].begin(), (*uses)[j].end(), b) != (*uses)[j].end();
      if (in && (!backward || read_back[b])) n += bytes_of(b, backward);
    }
    return n;
  }
  // Block `k` and the `depth` blocks after it in the pass's direction that read a bucket: what
  // ParameterShards holds gathered while `k` computes.
  std::vector<size_t> window(size_t k, int depth, bool backward) const {
    std::vector<size_t> out{k};
    const auto n = static_cast<std::ptrdiff_t>(uses->size());
    for (std::ptrdiff_t j = static_cast<std::ptrdiff_t>(k) + (backward ? -1 : 1);
         j >= 0 && j < n && out.size() <= static_cast<size_t>(depth); j += backward ? -1 : 1) {
      if (reads(static_cast<size_t>(j), backward)) out.push_back(static_cast<size_t>(j));
    }
    return out;
  }
};

}  // namespace

int64_t gathered_parameter_bytes(const ModelProfile& profile, int64_t element_bytes,
                                 const std::vector<size_t>* backward_reads, int prefetch, const ProfilePoint* copies) {
  const BlockBuckets g(profile, element_bytes, backward_reads, copies);
  if (g.empty()) return 0;
  // What is gathered where activations peak, as forward ends and backward runs (early in
  // forward, with few activations kept, less counts: gathered_parameter_peak_bytes walks the
  // step): forward ends with the last block's buckets gathered (what backward reads first);
  // backward holds a block's buckets that it reads again and those of the `prefetch` blocks
  // before it.
  int64_t most = g.held({g.uses->size() - 1}, /*backward=*/false);
  for (size_t k = 0; k < g.uses->size(); ++k) most = std::max(most, g.held(g.window(k, prefetch, true), true));
  return most;
}

namespace {

}  // namespace

int64_t gathered_parameter_peak_bytes(const ModelProfile& profile, const StepTrace& trace, int64_t element_bytes,
                                      const std::vector<size_t>* backward_reads, int prefetch,
                                      int64_t gradient_element_bytes, bool overlapped,
                                      const std::vector<int64_t>& part_bytes, const StepFold* fold,
                                      const ProfilePoint* copies) {
  const BlockBuckets g(profile, element_bytes, backward_reads, copies);
  if (g.empty() || trace.events.empty()) {
    int64_t largest = 0;  // without a trace: the largest bucket's gradient block, beside them
    for (const std::vector<int64_t>& members : profile.block_buckets) {
      int64_t n = 0;
      for (int64_t e : members) n += e;
      if (gradient_element_bytes > 0) largest = std::max(largest, arena_bytes(gradient_element_bytes * n));
    }
    return gathered_parameter_bytes(profile, element_bytes, backward_reads, prefetch, copies) + largest;
  }
  const size_t blocks = g.uses->size();
  // What each block holds gathered while it runs, forward [0, blocks) and backward [blocks, 2 blocks);
  // outside the blocks (the loss), what forward ended with, and of it in backward what backward
  // reads (ParameterShards frees the rest as backward begins).
  std::vector<int64_t> held(2 * blocks);
  for (size_t k = 0; k < blocks; ++k) {
    held[k] = g.held(g.window(k, prefetch, false), false);
    held[blocks + k] = g.held(g.window(k, prefetch, true), true);
  }
  const int64_t after_forward = g.held({blocks - 1}, false), backward_loss = g.held({blocks - 1}, true);
  std::optional<StepFold> own;
  if (fold == nullptr) fold = &own.emplace(fold_step(profile, trace));
  // The gradient blocks as ZeRO-2's walk places them (planner/gradient_blocks.h), to backward's end.
  GradientBlockSteps steps;
  if (gradient_element_bytes > 0) {
    steps = gradient_block_steps(profile, *fold, gradient_element_bytes, overlapped, part_bytes);
  } else {
    steps.end = fold->end;
  }
  return walk_above_peak(trace, *fold, steps, [&](const TraceKernel& k) {
    const bool known = k.block >= 0 && static_cast<size_t>(k.block) < blocks;
    return known ? held[(k.backward ? blocks : 0) + static_cast<size_t>(k.block)] : (k.backward ? backward_loss : after_forward);
  });
}

GatherTimes parameter_gather_ms(const ModelProfile& profile, const Machine& machine, const Plan& plan,
                                double micro_batch_ms) {
  GatherTimes t;
  const ProfilePoint* point = nullptr;  // the block times and backward's reads at the plan's precision
  for (const ProfilePoint& q : profile.points) {
    if (q.precision != plan.precision) continue;
    if (point == nullptr || std::llabs(q.micro_batch - plan.micro_batch) < std::llabs(point->micro_batch - plan.micro_batch)) {
      point = &q;
    }
  }
  const int64_t element = profile.parameters > 0 ? profile.gradient_bytes / profile.parameters : 4;
  const bool copies = gathers_16bit_copies(plan) && point != nullptr;
  const BlockBuckets g(profile, element, point != nullptr ? &point->backward_read_buckets : nullptr,
                       copies ? point : nullptr);
  if (g.empty() || plan.weight_replicas() <= 1) return t;
  const size_t blocks = g.uses->size();
  // Each block's compute, its share of the micro-batch's (the profile's block times; even when unknown).
  std::vector<double> forward(blocks, micro_batch_ms / 3.0 / static_cast<double>(blocks));
  std::vector<double> backward(blocks, 2.0 * forward.front());
  if (point != nullptr && point->blocks.size() == blocks) {
    double total = 0;
    for (const BlockTime& b : point->blocks) total += b.forward_ms + b.backward_ms;
    for (size_t k = 0; total > 0 && k < blocks; ++k) {
      forward[k] = micro_batch_ms * point->blocks[k].forward_ms / total;
      backward[k] = micro_batch_ms * point->blocks[k].backward_ms / total;
    }
  }
  // A pass gathers each block's buckets that the block before it (in the pass's order) did not
  // leave gathered; with prefetch the gather runs while that block computes, and the pass waits
  // only for what outlasts it (the first block's, whole). Only on devices with an engine of
  // their own for it (a GPU's, NCCL's): CPU ranks gather with the cores that compute, and a
  // prefetched gather hides nothing there (as the all-reduce, planner/cost_model.cpp; measured:
  // docs/parallelism.md, bench_sharding). Backward starts from the last block's, still gathered;
  // tied buckets stay gathered from their first read in backward to its end.
  const bool overlap = plan.prefetch > 0 && !machine.shared_host;
  auto pass = [&](bool back) {
    std::vector<bool> gathered(g.bytes.size(), false);
    if (back)
      for (size_t b : g.uses->back()) gathered[b] = true;
    const double* computing = nullptr;
    for (size_t i = 0; i < blocks; ++i) {
      const size_t k = back ? blocks - 1 - i : i;
      double ms = 0;
      for (size_t b : (*g.uses)[k]) {
        if (gathered[b] || (back && !g.read_back[b])) continue;
        for (const BlockBuckets::Part& part : g.parts[b])
          if (!back || part.read_back) ms += allgather_ms(machine, plan.weight_replicas(), part.bytes, plan.tensor);
        gathered[b] = back && g.readers[b] > 1;
      }
      if (!back) {  // forward frees what the next block does not read
        std::fill(gathered.begin(), gathered.end(), false);
        for (size_t b : (*g.uses)[k]) gathered[b] = true;
      }
      const double hidden = overlap && computing != nullptr ? std::min(ms, *computing) : 0.0;
      t.total_ms += ms;
      t.exposed_ms += ms - hidden;
      if (g.reads(k, back)) computing = back ? &backward[k] : &forward[k];
    }
  };
  pass(false);
  pass(true);
  return t;
}

int prefetch_depth(const Plan& plan) {
  const bool managed = plan.budget_bytes > 0 && evicts(plan.policy);
  // A tensor- or context-parallel rank's groups exchange on the computing thread: no other thread
  // may use MPI.
  return plan.shard == ShardLevel::kParameters && !managed && plan.tensor == 1 && plan.context == 1 ? plan.prefetch : 0;
}

bool reduce_scatters_overlap(const Plan& plan) {
  if (!plan.overlap || plan.weight_replicas() <= 1 || plan.tensor > 1 || plan.context > 1) return false;
  // Sharded masters' reduce-scatters share the gathers' thread (none without prefetch), as ZeRO-3's.
  if (plan.shard == ShardLevel::kGradients) return !shards_masters(plan) || plan.prefetch > 0;
  return plan.shard == ShardLevel::kParameters && prefetch_depth(plan) > 0;
}

ReadsInFp32 reads_in_fp32(const ModelProfile& profile, const Plan& plan) {
  ReadsInFp32 out;
  const ProfilePoint* point = nullptr;
  for (const ProfilePoint& pt : profile.points)
    if (pt.precision == plan.precision) point = &pt;
  if (point == nullptr) return out;
  const auto& block_buckets = profile.block_buckets;
  // At "gradients" the buckets are cut at blocks as the profile's are, so which holds a weight read
  // in 16 bits is known; at "optimizer" they are cut by size: every one is taken to hold one.
  const bool known = plan.shard >= ShardLevel::kGradients && !block_buckets.empty();
  std::vector<bool> half(block_buckets.size(), !known);
  for (size_t b : point->half_read_buckets)
    if (b < half.size()) half[b] = true;
  for (const auto& [b, n] : point->fp32_read_elements) {
    out.elements.push_back(n);
    if (b >= half.size() || half[b]) out.in_copies += n;
  }
  return out;
}

int64_t masters_gathered_bytes(const ModelProfile& profile, const Plan& plan) {
  const ReadsInFp32 fp32 = reads_in_fp32(profile, plan);
  int64_t n = 2 * fp32.in_copies;  // their slots in the 16-bit buckets (the copies are weight_copy_memory_terms')
  for (int64_t e : fp32.elements) n += arena_bytes(4 * e);
  return n;
}

double shard_step_share(const ModelProfile& profile, const Plan& plan) {
  const auto& buckets = sharded_buckets(profile, plan.shard);
  if (plan.shard == ShardLevel::kNone || plan.weight_replicas() <= 1 || buckets.empty() || profile.parameters <= 0) return 1;
  return static_cast<double>(shard_elements(buckets, plan.weight_replicas())) / static_cast<double>(profile.parameters);
}

namespace {

// The gathered buckets' bytes beside the activations' peak at "parameters": the most any block
// reads (tied buckets held); along `trace` when given, placed where each block runs, with each
// bucket's gradient block from its first gradient to its reduce-scatter.
// Plans are predicted on several threads (search.cpp): the profile's walks are shared.
std::mutex g_gathered_mutex;

int64_t gathered_term(const ModelProfile& profile, const Plan& plan, const TraceMaker* step,
                      int64_t element) {
  // What backward reads again, as the profile saw it at the plan's precision (all, if unseen).
  const std::vector<size_t>* backward_reads = nullptr;
  const ProfilePoint* copies = nullptr;  // 16-bit gathers: what they gather, as the profile saw it
  for (const ProfilePoint& point : profile.points) {
    if (point.precision != plan.precision) continue;
    backward_reads = &point.backward_read_buckets;
    if (gathers_16bit_copies(plan)) copies = &point;
  }
  if (step == nullptr) return gathered_parameter_bytes(profile, 4, backward_reads, prefetch_depth(plan), copies);
  // Everything the walk reads: the step at the plan's micro-batch and precision (not its batch,
  // which adds the same to the walk and the trace's peak: memory_terms.cpp), the prefetch, the
  // overlap, and the shard of each bucket (by the ranks) where micro-batches accumulate.
  const auto key = std::make_tuple(plan.micro_batch, static_cast<int>(plan.precision), prefetch_depth(plan),
                                   reduce_scatters_overlap(plan), plan.accumulation > 1 ? plan.weight_replicas() : 0,
                                   copies != nullptr && plan.policy == MemoryPolicy::kNone ? 2 : copies != nullptr ? 1 : 0,
                                   bf16_gradients(plan));
  {
    const std::lock_guard<std::mutex> lock(g_gathered_mutex);
    auto it = profile.gathered_walks.find(key);
    if (it != profile.gathered_walks.end()) return it->second;
  }
  const SharedTrace trace = (*step)();
  int64_t walked = 0;
  if (copies != nullptr) {
    // No cast lives from forward to backward: the walk is along the step without them.
    const SharedTrace held = shared_without_weight_casts(profile, trace);  // another thread may drop it from the profile
    const StepTrace& uncast = *held;
    walked = gathered_parameter_peak_bytes(profile, uncast, 4, backward_reads, prefetch_depth(plan), element,
                                           reduce_scatters_overlap(plan), reduce_scatter_parts(profile, plan),
                                           shared_step_fold(profile, held).get(), copies);
    // Against the step with its casts, whose peak the activations are without a policy: what the
    // casts took from it comes off (the walk may then be below it). A policy's activations are its
    // own figure (a replay, recomputed blocks): the walk stays above the step without casts.
    if (plan.policy == MemoryPolicy::kNone) walked += live_peak_bytes(uncast) - live_peak_bytes(*trace);
  } else {
    walked = gathered_parameter_peak_bytes(profile, *trace, 4, backward_reads, prefetch_depth(plan), element,
                                           reduce_scatters_overlap(plan), reduce_scatter_parts(profile, plan),
                                           shared_step_fold(profile, trace).get());
  }
  const std::lock_guard<std::mutex> lock(g_gathered_mutex);
  profile.gathered_walks.emplace(key, walked);
  return walked;
}

}  // namespace

void shard_memory_terms(const ModelProfile& profile, const Plan& plan, Prediction& p,
                        const TraceMaker* step, int64_t gradient_blocks) {
  const auto& buckets = sharded_buckets(profile, plan.shard);
  if (plan.shard == ShardLevel::kNone || plan.weight_replicas() <= 1 || buckets.empty()) return;
  const int64_t per_element = state_bytes_per_element(profile);
  const int64_t element = gradient_element_bytes(profile, plan);
  // Each rank's share and its largest piece: the optimizer's temporaries are the size of the
  // largest tensor it steps, measured whole with the largest parameter.
  std::vector<int64_t> elements(static_cast<size_t>(plan.weight_replicas())), largest_piece(static_cast<size_t>(plan.weight_replicas()));
  std::vector<int64_t> gradient_shards(static_cast<size_t>(plan.weight_replicas()));  // "gradients": one tensor a bucket
  std::vector<int64_t> parameter_shards(static_cast<size_t>(plan.weight_replicas()));  // "parameters": one tensor a bucket
  std::vector<int64_t> copy_shards(static_cast<size_t>(plan.weight_replicas()));  // and its 16-bit copy (gathers_16bit_copies)
  const bool copies = plan.shard == ShardLevel::kParameters && gathers_16bit_copies(plan);
  const bool masters = shards_masters(plan);  // ZeRO-1/2: the fp32 weights sharded (rounded in place)
  int64_t largest = 0, largest_bucket = 0, bucketed = 0;
  for (const std::vector<int64_t>& members : buckets) {
    int64_t bucket = 0;
    for (int64_t n : members) {
      largest = std::max(largest, n);
      bucket += n;
    }
    largest_bucket = std::max(largest_bucket, bucket);
    bucketed += bucket;
    const BucketShards s = shard_bucket(members, plan.weight_replicas());
    for (size_t r = 0; r < elements.size(); ++r) {
      elements[r] += s.counts[r];
      gradient_shards[r] += arena_bytes(element * s.counts[r]);
      parameter_shards[r] += arena_bytes(4 * s.counts[r]);
      if (copies) copy_shards[r] += arena_bytes(2 * s.counts[r]);
      for (const ShardPiece& piece : s.pieces[r]) largest_piece[r] = std::max(largest_piece[r], piece.length);
    }
  }
  // "gradients": the shards, and the blocks of the buckets backward fills in place of the whole
  // gradient block: placed along the step where there is one (each from its first gradient to its
  // reduce-scatter, overlapped: to the next one's), else the largest taken as if it stayed.
  const bool gradients_sharded = plan.shard >= ShardLevel::kGradients;
  int64_t in_flight = gradients_sharded ? arena_bytes(element * largest_bucket) : 0;
  int64_t along = 0;  // above the activations' peak, in the forward-backward phase only
  if (plan.shard == ShardLevel::kGradients && (gradient_blocks >= 0 || step != nullptr)) {
    const int64_t walked = gradient_blocks >= 0 ? gradient_blocks : gradient_blocks_term(profile, plan, *step);
    if (walked >= 0) {
      in_flight = 0;
      along = walked;
    }
  }
  // "parameters": the bucketed parameters give way to the rank's shards (fp32) and the buckets
  // gathered at once (parallel/parameter_shards.h), in the forward-backward phase only.
  const bool parameters_sharded = plan.shard == ShardLevel::kParameters;
  const int64_t gathered = parameters_sharded ? gathered_term(profile, plan, step, element) : 0;
  // 16-bit gathers: no weight's cast is held from its forward to its backward (along a step the
  // walk's figure is against the step with them; else the casts alive at its peak leave the
  // activations), and each rank keeps its shards' 16-bit copies.
  if (copies) {
    if (step == nullptr && plan.policy == MemoryPolicy::kNone)
      p.activation_bytes = std::max<int64_t>(0, p.activation_bytes - weight_casts(profile, plan.precision, plan.micro_batch).alive_at_peak);
    p.weight_copy_bytes = copy_shards.front();
  }
  if (parameters_sharded && step != nullptr) in_flight = 0;  // in `gathered`, along the trace
  // Sharded masters: the bucketed parameters give way to the rank's shards, and what a step reads
  // stays gathered: the 16-bit copies (weight_copy_memory_terms) and the weights read in fp32.
  const int64_t model = parameters_sharded ? p.model_bytes - arena_bytes(4 * bucketed)
                        : masters          ? p.model_bytes - arena_bytes(4 * bucketed) + masters_gathered_bytes(profile, plan)
                                           : p.model_bytes;
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
    const int64_t parameters = parameters_sharded || masters ? parameter_shards[r] + copy_shards[r] : 0;
    const int64_t rank_peak = fixed + parameters + gradients + state + std::max(p.activation_bytes + gathered + along, working);
    if (rank_peak > peak) {  // the fullest rank is the prediction
      peak = rank_peak;
      p.optimizer_state_bytes = state;
      p.optimizer_working_bytes = working;
      if (gradients_sharded) p.gradient_bytes = gradients;
      if (parameters_sharded || masters) p.model_bytes = model + parameters;
    }
  }
  p.peak_bytes = peak;
}

void shard_time_terms(const ModelProfile& profile, const Machine& machine, const Plan& plan, Prediction& p) {
  if (plan.shard == ShardLevel::kNone || plan.weight_replicas() <= 1) return;
  int64_t elements = 0;
  for (const std::vector<int64_t>& members : sharded_buckets(profile, plan.shard))
    for (int64_t n : members) elements += n;
  int64_t bytes = profile.parameters > 0 ? elements * (profile.gradient_bytes / profile.parameters) : 0;
  // The gradients' reduce-scatters move them in their own type (training.gradient_dtype).
  int64_t gradient_bytes = elements * gradient_element_bytes(profile, plan);
  // Pipeline stages (ZeRO-1 only): each stage's replicas gather that stage's parameters; the
  // fullest stage's share is the step's.
  if (plan.stages > 1) {
    bytes = std::llround(static_cast<double>(bytes) * p.stage_state_share);
    gradient_bytes = std::llround(static_cast<double>(gradient_bytes) * p.stage_state_share);
  }
  if (plan.shard == ShardLevel::kParameters) {
    // Every micro-batch gathers each block's buckets in forward and those backward reads again;
    // prefetched, what the block before computes hides.
    Plan prefetching = plan;
    prefetching.prefetch = prefetch_depth(plan);
    const double micro_batch_ms = p.compute_ms / static_cast<double>(std::max<int64_t>(1, plan.accumulation));
    const GatherTimes g = parameter_gather_ms(profile, machine, prefetching, micro_batch_ms);
    p.gather_ms = g.exposed_ms * static_cast<double>(plan.accumulation);
    p.gather_hidden_ms = (g.total_ms - g.exposed_ms) * static_cast<double>(plan.accumulation);
  } else if (shards_masters(plan)) {
    // The 16-bit copies of each bucket and its weights read in fp32 (each a collective of its own),
    // at their first read after the step; priced as exposed (ZeRO-2 prefetches them under the
    // first micro-batch's blocks).
    const ReadsInFp32 fp32 = reads_in_fp32(profile, plan);
    p.gather_ms = allgather_ms(machine, plan.weight_replicas(), 2 * elements, plan.tensor);
    for (int64_t n : fp32.elements) p.gather_ms += allgather_ms(machine, plan.weight_replicas(), 4 * n, plan.tensor);
  } else {
    p.gather_ms = allgather_ms(machine, plan.weight_replicas(), bytes, plan.tensor);  // the updated parameters, after the step
  }
  if (plan.shard >= ShardLevel::kGradients) {
    // A reduce-scatter (a ring's half of an all-reduce) for every micro-batch: on the thread that
    // runs backward, nothing hides it; overlapped (reduce_scatters_overlap), the caller hides it
    // under backward where the device has an engine for it (planner/cost_model.cpp).
    p.allreduce_ms = allgather_ms(machine, plan.weight_replicas(), gradient_bytes, plan.tensor) * static_cast<double>(plan.accumulation);
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

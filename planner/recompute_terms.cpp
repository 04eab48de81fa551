#include "planner/recompute_terms.h"

#include "alloc/cpu_arena.h"
#include "planner/dtr_replay.h"
#include "planner/memory_terms.h"
#include "planner/pipeline_terms.h"
#include "planner/shard_terms.h"

#include <algorithm>
#include <cmath>
#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <tuple>

namespace ht {
namespace {

// Plans are predicted on several threads (search.cpp): the profiles' replay caches are shared.
std::mutex g_replays_mutex;

// What per_block keeps of each block (both 0: full recomputation's nothing), and the host link
// it may offload over (memory.block_offload; off: none).
struct BlockKeep {
  int64_t bytes = 0;
  double share = 0;
  schedule::BlockLink link;
};

using ReplayCache = decltype(ModelProfile::full_recompute_replays);

ReplayCache::key_type replay_key(int64_t micro_batch, MixedPrecision precision, int64_t budget_bytes, const BlockKeep& keep) {
  return {micro_batch, static_cast<int>(precision), budget_bytes, keep.bytes, keep.share, keep.link.ms_per_byte,
          keep.link.host_bytes};
}

// A replay at a smaller budget that holds at `budget_bytes` (the caller holds g_replays_mutex), or
// none. One the budget left alone (ReplayResult::budget_acted: no eviction for room or past the
// threshold, no allocation without a free block that fits, no block placed where the arena's
// capacity put it) that did not fail does, if both arenas' small blocks are the same size
// (CpuArena::small_block_bytes: a 256th of an arena below 256 MiB): at a larger budget every
// tensor is allocated and freed at the same kernels, the bytes in use are the same at every
// step, below a higher threshold, and every block goes where it went, the free block between the
// arena's two ends only larger (DtrReplay.AReplayTheBudgetLeftAloneHoldsAtEveryLargerBudget). A
// replay with a host link (offload) is never taken from another budget. The search's budgets for
// one device are the device less what one to three communicators hold (Machine::reserved_bytes),
// 700 MiB apart on an H100: each was replayed before.
const BlockRecomputeReplay* held_from_below(const ReplayCache& cache, const ReplayCache::key_type& key) {
  const auto& [micro_batch, precision, budget, keep_bytes, keep_share, ms_per_byte, host_bytes] = key;
  if (ms_per_byte > 0 || host_bytes > 0) return nullptr;
  const int64_t small = CpuArena::small_block_bytes(CpuArena::rounded_size(static_cast<size_t>(budget)));
  const auto first = cache.lower_bound(std::make_tuple(micro_batch, precision, int64_t{0}, int64_t{0}, 0.0, 0.0, int64_t{0}));
  for (auto it = first; it != cache.end(); ++it) {
    const auto& [m, p, b, kb, ks, ml, hb] = it->first;
    if (m != micro_batch || p != precision || b >= budget) break;
    const BlockRecomputeReplay& r = it->second;
    if (kb == keep_bytes && ks == keep_share && ml == 0 && hb == 0 && r.failure.empty() && !r.budget_acted &&
        CpuArena::small_block_bytes(CpuArena::rounded_size(static_cast<size_t>(b))) == small)
      return &r;
  }
  return nullptr;
}

BlockRecomputeReplay replay_blocks(const ModelProfile& profile, int64_t micro_batch, MixedPrecision precision,
                                   int64_t budget_bytes, BlockKeep keep) {
  const ReplayCache::key_type key = replay_key(micro_batch, precision, budget_bytes, keep);
  {
    const std::lock_guard<std::mutex> lock(g_replays_mutex);
    auto it = profile.full_recompute_replays.find(key);
    if (it != profile.full_recompute_replays.end()) return it->second;
    if (const BlockRecomputeReplay* below = held_from_below(profile.full_recompute_replays, key)) {
      const BlockRecomputeReplay held = *below;
      profile.full_recompute_replays.emplace(key, held);  // found at once next time (and by cached_replay)
      return held;
    }
  }
  ReplayOptions options;
  options.budget_bytes = budget_bytes;
  options.checkpoint_blocks = static_cast<int>(profile.block_parameter_bytes.size());
  options.block_keep_bytes = keep.bytes;
  options.block_keep_share = keep.share;
  options.block_link = keep.link;
  StepTrace trace = without_optimizer_phase(*shared_trace_for(profile, micro_batch, micro_batch, precision));
  trace.persistent_bytes = 0;
  const ReplayResult r = replay_step(trace, options);
  BlockRecomputeReplay out;
  if (r.feasible) {
    out.kept_bytes = r.forward_end_bytes;
    out.working_bytes = std::max<int64_t>(0, r.peak_bytes - r.forward_end_bytes);
    out.recompute_ms = r.recompute_ms;
    out.evictions = r.evictions;
    out.budget_acted = r.budget_acted;
    const schedule::SolvedBlock* most = nullptr;
    for (const schedule::SolvedBlock& b : r.blocks)
      if (most == nullptr || b.uses > most->uses) most = &b;
    if (most != nullptr) out.block = std::make_shared<const schedule::SolvedBlock>(*most);
    out.block_micro_batch = micro_batch;
    out.offload_out_bytes = r.offload_out_bytes;
    out.offload_in_bytes = r.offload_in_bytes;
    out.offload_exposed_ms = r.offload_exposed_ms;
  } else {
    out.failure = r.failure;
    out.min_budget_bytes = r.min_budget_bytes;
  }
  const std::lock_guard<std::mutex> lock(g_replays_mutex);
  profile.full_recompute_replays.emplace(key, out);  // a replay another thread finished first stays
  return out;
}

// The replay replay_blocks keeps for these arguments, if one was made.
std::optional<BlockRecomputeReplay> cached_replay(const ModelProfile& profile, int64_t micro_batch,
                                                  MixedPrecision precision, int64_t budget_bytes, BlockKeep keep) {
  const std::lock_guard<std::mutex> lock(g_replays_mutex);
  auto it = profile.full_recompute_replays.find(replay_key(micro_batch, precision, budget_bytes, keep));
  if (it == profile.full_recompute_replays.end()) return std::nullopt;
  return it->second;
}

// The profiled micro-batch sizes at `precision` (the profile's own thread count), ascending.
std::vector<int64_t> profiled_sizes(const ModelProfile& profile, MixedPrecision precision) {
  std::vector<int64_t> sizes;
  for (const ProfilePoint& pt : profile.points)
    if (pt.precision == precision && pt.threads == profile.threads) sizes.push_back(pt.micro_batch);
  std::sort(sizes.begin(), sizes.end());
  return sizes;
}

// What per_block keeps of each block, as the run is configured (full: nothing), and its link.
BlockKeep block_keep(const Plan& plan, const schedule::BlockLink& link) {
  if (plan.policy != MemoryPolicy::kPerBlock) return {};
  BlockKeep keep = plan.block_keep_share > 0 ? BlockKeep{0, plan.block_keep_share} : BlockKeep{plan.block_keep_bytes, 0};
  if (plan.block_offload) keep.link = link;
  return keep;
}

struct ReplayKey {
  int64_t micro_batch, budget_bytes;
};

// A replay's figures hold at a smaller budget when the larger one's run never came near it: each
// kernel's outputs are at most the peak, so a run that peaked at half the eviction threshold's
// share of `budget` never evicted for room there, and never asked for a block the gap between
// the arena's two ends could not give.
bool holds_at(const BlockRecomputeReplay& r, int64_t budget_bytes) {
  const int64_t peak = r.kept_bytes + r.working_bytes;
  return r.failure.empty() && 2 * peak <= static_cast<int64_t>(0.9 * static_cast<double>(budget_bytes));
}

// A room of at least twice the budget, rounded up to a power of two (plans whose budgets differ
// by what the runtime holds beside them, Machine::reserved_bytes, share it).
int64_t room_for(int64_t budget_bytes) {
  int64_t room = 1;
  while (room < 2 * budget_bytes) room *= 2;
  return room;
}

// The replays block_recompute_terms reads for `plan`: one at its size and budget, or, where the
// profile's times are priced from the kernels' work, in a room (room_for) the plan's own size if
// it is one of the two smallest (the budget's own replay only if the room's came near it), else
// the two smallest sizes'. Measured times are not extrapolated from the two smallest sizes:
// trained at 1 and 2 samples, their drift put a ConvNet's regenerations at 16 below zero.
std::vector<ReplayKey> first_replays(const ModelProfile& profile, const Plan& plan) {
  const std::vector<int64_t> sizes = profiled_sizes(profile, plan.precision);
  if (profile.times_measured || sizes.size() < 2) return {{plan.micro_batch, plan.budget_bytes}};
  const int64_t room = room_for(plan.budget_bytes);
  // Bytes a block keeps are another share of it at every size: not on a line.
  if (plan.micro_batch <= sizes[1] || block_keep(plan, {}).bytes > 0) return {{plan.micro_batch, room}};
  return {{sizes[0], room}, {sizes[1], room}};
}

struct AheadJob {
  const ModelProfile* profile;
  int64_t micro_batch;
  MixedPrecision precision;
  std::vector<int64_t> budgets;  // replayed in this order, one after the other
  BlockKeep keep;
};

// Each job on one of up to `threads` threads.
void run_ahead(const std::vector<AheadJob>& jobs, int threads) {
  std::atomic<size_t> next{0};
  auto work = [&] {
    try {
      for (size_t i = next++; i < jobs.size(); i = next++)
        for (int64_t budget : jobs[i].budgets)
          replay_blocks(*jobs[i].profile, jobs[i].micro_batch, jobs[i].precision, budget, jobs[i].keep);
    } catch (...) {
      next = jobs.size();  // a head start only: predict replays what is missing, and says what failed
    }
  };
  std::vector<std::thread> pool;
  const size_t workers = std::min(static_cast<size_t>(std::clamp(threads, 1, 16)), jobs.size());
  for (size_t t = 1; t < workers; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
}

}  // namespace

// A search predicts thousands of plans over a dozen micro-batch sizes per tensor-parallel size,
// and a 70B model's replay takes a tenth of a second: the two smallest sizes are replayed (in
// at least twice the budget, so that both run) and the others' bytes lie on the line through them,
// as every tensor's bytes do; their regenerations take the larger size's share of the step's
// forward and backward. A size whose sum passes the budget does not fit (predict's device-memory
// check).
BlockRecomputeReplay block_recompute_terms(const ModelProfile& profile, const Plan& plan, const schedule::BlockLink& link) {
  const BlockKeep keep = block_keep(plan, link);
  const std::vector<ReplayKey> keys = first_replays(profile, plan);
  if (keys.size() == 1) {
    if (keys[0].budget_bytes == plan.budget_bytes) {
      return replay_blocks(profile, plan.micro_batch, plan.precision, plan.budget_bytes, keep);
    }
    const BlockRecomputeReplay roomy = replay_blocks(profile, plan.micro_batch, plan.precision, keys[0].budget_bytes, keep);
    if (holds_at(roomy, plan.budget_bytes)) return roomy;
    return replay_blocks(profile, plan.micro_batch, plan.precision, plan.budget_bytes, keep);
  }
  const int64_t ma = keys[0].micro_batch, mb = keys[1].micro_batch;
  const BlockRecomputeReplay a = replay_blocks(profile, ma, plan.precision, keys[0].budget_bytes, keep);
  const BlockRecomputeReplay b = replay_blocks(profile, mb, plan.precision, keys[1].budget_bytes, keep);
  if (!a.failure.empty() || !b.failure.empty()) {
    return replay_blocks(profile, plan.micro_batch, plan.precision, plan.budget_bytes, keep);
  }
  const double t = static_cast<double>(plan.micro_batch - ma) / static_cast<double>(mb - ma);
  auto line = [&](double x, double y) { return x + (y - x) * t; };
  BlockRecomputeReplay out;
  out.kept_bytes = std::llround(line(static_cast<double>(a.kept_bytes), static_cast<double>(b.kept_bytes)));
  out.working_bytes = std::llround(line(static_cast<double>(a.working_bytes), static_cast<double>(b.working_bytes)));
  // A keep share's cut may fall between other tensors of a block at the two sizes, and then the
  // kept bytes are off the line: it fell to -50 GB at 4 samples for Llama 3 8B at 128K tokens and
  // tensor_parallel 2 (a negative block cost in the stages' cut); where they fall from the smaller
  // size to the larger, the line under-states them everywhere past it. Replayed at the size itself.
  if (b.kept_bytes < a.kept_bytes || out.kept_bytes < 0 || out.working_bytes < 0) {
    return replay_blocks(profile, plan.micro_batch, plan.precision, plan.budget_bytes, keep);
  }
  // Time is not on the line: a kernel priced from its work at a device's efficiency curve runs
  // its first samples at a low rate, so a regeneration can cost less at 2 samples than at 1, and
  // the line through them fell below zero at 128 (GPT-2 124M at tensor_parallel 2: -5.2 ms). The
  // same kernels are regenerated at every size: their share of forward and backward at the larger
  // size replayed, of forward and backward at the plan's.
  const double fb_b = forward_backward_ms(profile, mb, plan.precision, profile.threads);
  const double fb = forward_backward_ms(profile, plan.micro_batch, plan.precision, profile.threads);
  out.recompute_ms = fb_b > 0 ? b.recompute_ms / fb_b * fb : 0.0;
  out.evictions = b.evictions;  // the same tensors at every size
  // Offloaded bytes are on the line too; the link's unhidden time at the larger size's share of them.
  out.offload_out_bytes = std::llround(line(static_cast<double>(a.offload_out_bytes), static_cast<double>(b.offload_out_bytes)));
  out.offload_in_bytes = std::llround(line(static_cast<double>(a.offload_in_bytes), static_cast<double>(b.offload_in_bytes)));
  out.offload_exposed_ms = b.offload_out_bytes > 0 ? b.offload_exposed_ms * static_cast<double>(out.offload_out_bytes) /
                                                         static_cast<double>(b.offload_out_bytes)
                                                   : 0.0;
  out.block = a.block;
  out.block_micro_batch = a.block_micro_batch;
  return out;
}

void replay_blocks_ahead(const std::vector<std::pair<const ModelProfile*, Plan>>& plans, int threads) {
  // First the rooms', each distinct one once.
  using RoomKey = std::tuple<const ModelProfile*, int64_t, int, int64_t, int64_t, double>;
  std::set<RoomKey> seen;
  std::vector<AheadJob> jobs;
  for (const auto& [profile, plan] : plans) {
    const BlockKeep keep = block_keep(plan, {});  // a cluster's search offers no offload
    for (const ReplayKey& k : first_replays(*profile, plan)) {
      if (seen.emplace(profile, k.micro_batch, static_cast<int>(plan.precision), k.budget_bytes, keep.bytes, keep.share)
              .second)
        jobs.push_back({profile, k.micro_batch, plan.precision, {k.budget_bytes}, keep});
    }
  }
  run_ahead(jobs, threads);
  // Then the budgets where a room's replay does not hold: each replay's budgets on one thread,
  // smallest first, so that the larger ones find it (held_from_below) rather than replay again.
  using BudgetsKey = std::tuple<const ModelProfile*, int64_t, int, int64_t, double>;
  std::map<BudgetsKey, AheadJob> by_replay;
  for (const auto& [profile, plan] : plans) {
    const std::vector<ReplayKey> keys = first_replays(*profile, plan);
    if (keys.size() != 1 || keys[0].budget_bytes == plan.budget_bytes) continue;
    const BlockKeep keep = block_keep(plan, {});
    const std::optional<BlockRecomputeReplay> room =
        cached_replay(*profile, plan.micro_batch, plan.precision, keys[0].budget_bytes, keep);
    if (!room || holds_at(*room, plan.budget_bytes)) continue;
    AheadJob& job = by_replay[{profile, plan.micro_batch, static_cast<int>(plan.precision), keep.bytes, keep.share}];
    if (job.budgets.empty()) job = {profile, plan.micro_batch, plan.precision, {}, keep};
    job.budgets.push_back(plan.budget_bytes);
  }
  jobs.clear();
  for (auto& [key, job] : by_replay) {
    std::sort(job.budgets.begin(), job.budgets.end());
    job.budgets.erase(std::unique(job.budgets.begin(), job.budgets.end()), job.budgets.end());
    jobs.push_back(std::move(job));
  }
  run_ahead(jobs, threads);
}

void block_recompute_step_terms(const ModelProfile& profile, const Machine& machine, const Plan& plan,
                                const BlockRecomputeReplay& blocks,
                                double fb_ms, double slowdown, Prediction& p) {
  if (plan.stages > 1) {
    // Each micro-batch's regenerations run in its stages' backward: inside the schedule. Under a
    // per-stage plan each rank's blocks keep its own share (each its own replay).
    std::vector<StageRecompute> ranks;
    double regenerate = 0, whole = 0, link_ms = 0;
    int64_t evictions = 0, offload_out = 0;
    const schedule::BlockLink link = block_link(profile, machine, plan);
    for (int r = 0; r < plan.stages; ++r) {
      BlockRecomputeReplay own;
      const BlockRecomputeReplay* b = &blocks;
      if (static_cast<size_t>(r) < plan.stage_block_keep.size()) {
        Plan q = plan;
        q.block_keep_bytes = 0;
        q.block_keep_share = plan.stage_block_keep[static_cast<size_t>(r)];
        q.stage_block_keep.clear();
        own = block_recompute_terms(profile, q, block_link(profile, machine, plan));
        if (!own.failure.empty()) {
          p.fits = false;
          p.why_not = "stage " + std::to_string(r) + "'s micro-batch with its blocks' plan does not fit: " + own.failure;
          return;
        }
        b = &own;
      }
      const double rank_regenerate = b->recompute_ms * slowdown;
      // The replay is the whole model's at the stage's plan: a stage offloads its share of the
      // blocks' copies (1 / stages of them), and waits on the link's unhidden time inside each
      // micro-batch's forward and backward, as its regenerations run there (whole-model times,
      // which pipeline_terms spreads over the blocks as it does fb_ms).
      const double exposed = b->offload_exposed_ms;
      ranks.push_back({fb_ms + rank_regenerate + exposed, b->kept_bytes, b->working_bytes});
      regenerate += rank_regenerate;
      whole += fb_ms + rank_regenerate + exposed;
      evictions += b->evictions;
      offload_out += b->offload_out_bytes / plan.stages;
      link_ms += static_cast<double>(b->offload_out_bytes + b->offload_in_bytes) / plan.stages * link.ms_per_byte;
    }
    // The link's bytes and time, the stages' mean per rank (the exposed time is in the schedule
    // above, not added again). 2 stages of GPT at 0%, 0%: 1,021,952 bytes a step predicted and
    // copied out on stage 0.
    p.swap_out_bytes = offload_out * plan.accumulation / plan.stages;
    p.swap_link_ms = link_ms * static_cast<double>(plan.accumulation) / plan.stages;
    p.activation_bytes = blocks.kept_bytes;
    pipeline_terms(profile, machine, plan, ranks[0].fb_ms, p, /*activations_hold_casts=*/false, &ranks);
    if (p.stage_peak_bytes.empty()) {  // refused before its memory terms: the replay's, as one rank's
      p.activation_bytes += blocks.working_bytes;
      p.peak_bytes = p.working_peak_bytes();
    }
    const double share = whole > 0 ? regenerate / whole : 0;
    p.recompute_ms = p.compute_ms * share;
    p.compute_ms -= p.recompute_ms;
    p.evictions = evictions * plan.accumulation / plan.stages / plan.stages;
    return;
  }
  // The working set forward and backward need: the replay's in place of the activations kept.
  const int64_t activations = blocks.kept_bytes + blocks.working_bytes;
  p.peak_bytes += std::max(activations, p.optimizer_working_bytes) - std::max(p.activation_bytes, p.optimizer_working_bytes);
  p.activation_bytes = activations;
  p.recompute_ms = blocks.recompute_ms * static_cast<double>(plan.accumulation) * slowdown;
  p.evictions = blocks.evictions * plan.accumulation;
  if (blocks.offload_out_bytes > 0) {  // as eviction_terms counts the blocks' offloads
    const schedule::BlockLink link = block_link(profile, machine, plan);
    const auto micro = static_cast<double>(plan.accumulation);
    p.swap_out_bytes = blocks.offload_out_bytes * plan.accumulation;
    p.swap_link_ms = static_cast<double>(blocks.offload_out_bytes + blocks.offload_in_bytes) * link.ms_per_byte * micro;
    p.swap_exposed_ms = blocks.offload_exposed_ms * micro;
  }
}

schedule::BlockLink block_link(const ModelProfile& profile, const Machine& machine, const Plan& plan) {
  if (plan.policy != MemoryPolicy::kPerBlock || !plan.block_offload) return {};
  return block_link_of(machine, plan, static_cast<int>(profile.block_parameter_bytes.size()));
}

}  // namespace ht

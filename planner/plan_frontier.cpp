#include "planner/plan_frontier.h"

#include "alloc/byte_size.h"
#include "base/printf_string.h"
#include "planner/recompute_terms.h"
#include "schedule/block_plan.h"

#include <algorithm>
#include <tuple>

namespace ht {
namespace {

std::string in_mib(int64_t bytes) { return printf_string("%.1f", static_cast<double>(bytes) / (1 << 20)); }

std::string policy_words(const Plan& p) {
  std::string s = policy_cell(p);
  if (p.budget_bytes > 0 && evicts(p.policy) && !recomputes_blocks(p.policy)) s += " in " + format_bytes(p.budget_bytes);
  return s;
}

}  // namespace

bool same_layout(const Plan& a, const Plan& b) {
  auto key = [](const Plan& p) {
    return std::make_tuple(p.ranks, p.micro_batch, p.accumulation, static_cast<int>(p.precision), p.stages,
                           static_cast<int>(p.schedule), p.virtual_stages, p.state_on_host,
                           static_cast<int>(p.shard), p.overlap, p.tensor, p.sequence_parallel, p.context,
                           static_cast<int>(p.context_exchange));
  };
  // ZeRO-3's prefetch is searched without eviction only (evicting plans keep the default): it
  // tells two layouts apart where neither evicts.
  const bool both_keep_all = a.policy == MemoryPolicy::kNone && b.policy == MemoryPolicy::kNone;
  return key(a) == key(b) && (!both_keep_all || a.prefetch == b.prefetch);
}

std::string frontier_text(const std::vector<RankedPlan>& ranked, const Plan& of) {
  std::vector<const RankedPlan*> points;
  for (const RankedPlan& r : ranked)
    if (same_layout(r.plan, of)) points.push_back(&r);
  if (points.size() < 2) return "";
  std::stable_sort(points.begin(), points.end(), [](const RankedPlan* a, const RankedPlan* b) {
    return a->prediction.peak_bytes > b->prediction.peak_bytes;
  });
  double fastest = 0;
  for (const RankedPlan* r : points)
    if (r->prediction.fits && (fastest == 0 || r->prediction.step_ms < fastest)) fastest = r->prediction.step_ms;
  std::string s = printf_string("  %-34s  %13s  %8s  %9s  %4s\n", "policy", "peak/rank MiB", "step ms", "x fastest", "fits");
  for (const RankedPlan* r : points) {
    s += printf_string("  %-34s  %13s  %8.1f  %9s  %4s\n", policy_words(r->plan).c_str(),
                       in_mib(r->prediction.peak_bytes).c_str(), r->prediction.step_ms,
                       fastest > 0 ? printf_string("%.2f", r->prediction.step_ms / fastest).c_str() : "-",
                       r->prediction.fits ? "yes" : "no");
  }
  return s;
}

std::string block_kinds_text(const ModelProfile& profile, const Plan& plan) {
  if (plan.policy != MemoryPolicy::kPerBlock) return "";
  if (!plan.stage_block_keep.empty()) {
    // Per stage: each stage's share, then the table of the first stage that keeps any.
    std::string s = "  each stage keeps its share of what its blocks' backward reads (the first stage, holding the "
                    "most micro-batches in flight, the least; 0%: full recomputation): " +
                    stage_keep_words(plan.stage_block_keep) + "\n";
    for (size_t r = 0; r < plan.stage_block_keep.size(); ++r) {
      if (plan.stage_block_keep[r] <= 0) continue;
      Plan stage = plan;
      stage.stage_block_keep.clear();
      stage.block_keep_share = plan.stage_block_keep[r];
      const std::string table = block_kinds_text(profile, stage);
      return table.empty() ? s : s + "  stage " + std::to_string(r) + ":\n" + table;
    }
    return s;
  }
  if (plan.block_keep_share <= 0) return "";
  const BlockRecomputeReplay replay = block_recompute_terms(profile, plan);
  if (!replay.block) return "";
  const schedule::SolvedBlock& b = *replay.block;
  std::string s = printf_string(
      "  each block (micro-batch %lld) keeps %s of the %s MiB its backward reads and runs %d of its %zu ops again, "
      "by kind of tensor (the op that makes it; the rerun time as shares of the block's, by the trace's kernel costs):\n",
      static_cast<long long>(replay.block_micro_batch), in_mib(b.plan.kept_bytes).c_str(), in_mib(b.graph.saved_bytes()).c_str(),
      b.plan.recomputed_ops, b.graph.ops.size());
  s += printf_string("  %-16s  %5s  %11s  %5s  %11s  %11s  %11s\n", "made by", "saved", "saved MiB", "kept",
                     "kept MiB", "rerun/calls", "rerun time");
  for (const schedule::TensorKindPlan& k : schedule::plan_by_kind(b.graph, b.plan)) {
    const double share = b.plan.recompute_ms > 0 ? k.rerun_ms / b.plan.recompute_ms : 0;
    s += printf_string("  %-16s  %5d  %11s  %5d  %11s  %5d/%-5d  %10.0f%%\n", k.kind.c_str(), k.saved,
                       in_mib(k.saved_bytes).c_str(), k.kept, in_mib(k.kept_bytes).c_str(), k.rerun, k.calls, 100 * share);
  }
  s += "  (a cluster's search offers offload to host where cluster.host_memory describes the nodes' memory)\n";
  return s;
}

}  // namespace ht

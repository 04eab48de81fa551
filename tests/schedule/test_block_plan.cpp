// One block's keep-or-recompute plan (schedule/block_plan.h): the branch and bound against every
// keep set on random block graphs, a transformer-shaped block solved by hand, the frontier.
#include "schedule/block_plan.h"

#include <gtest/gtest.h>

#include <limits>
#include <random>

namespace ht::schedule {
namespace {

// Random DAGs: op i reads up to three earlier values; each op makes one or two values.
BlockGraph random_block(std::mt19937& rng, int ops) {
  BlockGraph g;
  for (int i = 0; i < ops; ++i) {
    BlockOp op;
    op.cost_ms = 1 + static_cast<double>(rng() % 20);
    const int reads = g.values.empty() ? 0 : 1 + static_cast<int>(rng() % 3);
    for (int r = 0; r < reads; ++r) op.inputs.push_back(static_cast<int>(rng() % g.values.size()));
    g.ops.push_back(op);
    const int outs = 1 + static_cast<int>(rng() % 4 == 0);
    for (int o = 0; o < outs; ++o) g.values.push_back({int64_t{1} + static_cast<int64_t>(rng() % 50), i, rng() % 3 != 0});
  }
  return g;
}

// The least cost over every keep set of saved values within the budget.
double brute_force(const BlockGraph& g, int64_t budget) {
  std::vector<int> saved;
  for (size_t v = 0; v < g.values.size(); ++v)
    if (g.values[v].saved) saved.push_back(static_cast<int>(v));
  double best = std::numeric_limits<double>::infinity();
  for (uint32_t mask = 0; mask < (1u << saved.size()); ++mask) {
    std::vector<bool> keep(g.values.size(), false);
    for (size_t i = 0; i < saved.size(); ++i) keep[saved[i]] = (mask >> i) & 1u;
    const BlockPlan p = plan_with(g, keep);
    if (p.kept_bytes <= budget) best = std::min(best, p.recompute_ms);
  }
  return best;
}

TEST(BlockPlan, TheSearchFindsTheLeastRecomputationOfEveryKeepSet) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 60; ++trial) {
    const BlockGraph g = random_block(rng, 4 + trial % 9);
    const int64_t all = g.saved_bytes();
    for (const double share : {0.0, 0.2, 0.5, 0.8, 1.0}) {
      const auto budget = static_cast<int64_t>(share * static_cast<double>(all));
      const BlockPlan p = solve_block_plan(g, budget);
      SCOPED_TRACE("trial " + std::to_string(trial) + " budget " + std::to_string(budget));
      EXPECT_TRUE(p.exact);
      EXPECT_LE(p.kept_bytes, budget);
      EXPECT_DOUBLE_EQ(p.recompute_ms, brute_force(g, budget));
      EXPECT_DOUBLE_EQ(plan_with(g, p.keep).recompute_ms, p.recompute_ms) << "the plan's own cost";
    }
  }
}

// The least cost over every keep / offload / regenerate answer of every saved value.
double brute_force_with_link(const BlockGraph& g, int64_t budget, const BlockLink& link) {
  std::vector<int> saved;
  for (size_t v = 0; v < g.values.size(); ++v)
    if (g.values[v].saved) saved.push_back(static_cast<int>(v));
  double best = std::numeric_limits<double>::infinity();
  int64_t ways = 1;
  for (size_t i = 0; i < saved.size(); ++i) ways *= 3;
  for (int64_t code = 0; code < ways; ++code) {
    std::vector<bool> keep(g.values.size(), false), offload(g.values.size(), false);
    bool allowed = true;
    int64_t c = code;
    for (int v : saved) {
      const int64_t answer = c % 3;
      c /= 3;
      keep[v] = answer == 1;
      offload[v] = answer == 2;
      if (offload[v] && g.values[v].bytes < link.min_bytes) allowed = false;
    }
    const BlockPlan p = plan_with(g, keep, offload, link);
    if (allowed && p.kept_bytes <= budget && p.offload_bytes <= link.host_bytes) best = std::min(best, p.cost_ms());
  }
  return best;
}

TEST(BlockPlan, WithAHostLinkTheSearchFindsTheLeastCostOfEveryThreeWayAnswer) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 40; ++trial) {
    const BlockGraph g = random_block(rng, 4 + trial % 6);
    const int64_t all = g.saved_bytes();
    double forward_ms = 0;
    for (const BlockOp& op : g.ops) forward_ms += op.cost_ms;
    BlockLink link;
    // From a link that hides everything to one that takes several forwards for the whole block.
    link.ms_per_byte = (trial % 4) * forward_ms / static_cast<double>(std::max<int64_t>(1, all));
    link.host_bytes = trial % 3 == 0 ? all : all / 2;
    link.min_bytes = trial % 5 == 0 ? 10 : 0;
    for (const double share : {0.0, 0.3, 0.7}) {
      const auto budget = static_cast<int64_t>(share * static_cast<double>(all));
      const BlockPlan p = solve_block_plan(g, budget, link);
      SCOPED_TRACE("trial " + std::to_string(trial) + " budget " + std::to_string(budget));
      EXPECT_TRUE(p.exact);
      EXPECT_LE(p.kept_bytes, budget);
      EXPECT_LE(p.offload_bytes, link.host_bytes);
      EXPECT_NEAR(p.cost_ms(), brute_force_with_link(g, budget, link), 1e-9);
      EXPECT_LE(p.cost_ms(), solve_block_plan(g, budget).cost_ms()) << "a link never makes a plan dearer";
      for (size_t v = 0; v < g.values.size(); ++v) EXPECT_FALSE(p.keep[v] && p.offload[v]);
    }
  }
}

TEST(BlockPlan, AHiddenLinkOffloadsWhatTheBudgetCannotKeepAndASlowOneRegeneratesIt) {
  // x -> matmul (h, 100 B, 8 ms) -> gelu (a, 100 B, 1 ms) -> matmul (out, 8 ms): backward reads h and a.
  BlockGraph g;
  g.ops = {{8, {}, "linear"}, {1, {0}, "gelu"}, {8, {1}, "linear"}};
  g.values = {{100, 0, true}, {100, 1, true}, {100, 2, false}};
  BlockLink hidden{/*ms_per_byte=*/0.1, /*host_bytes=*/1000, /*min_bytes=*/0};
  // Both on host: 200 B at 0.1 ms/B is 20 ms out, 3 ms past the 17 ms forward. One on host (10 ms,
  // hidden) and gelu run again (1 ms) costs less.
  EXPECT_DOUBLE_EQ(plan_with(g, {}, {true, true}, hidden).link_ms, 3);
  const BlockPlan none_kept = solve_block_plan(g, 0, hidden);
  EXPECT_TRUE(none_kept.offload[0]);
  EXPECT_EQ(none_kept.offload_bytes, 100);
  EXPECT_DOUBLE_EQ(none_kept.link_ms, 0);
  EXPECT_DOUBLE_EQ(none_kept.recompute_ms, 1);
  // Keeping one, the other crosses hidden.
  const BlockPlan one_kept = solve_block_plan(g, 100, hidden);
  EXPECT_EQ(one_kept.kept_bytes, 100);
  EXPECT_EQ(one_kept.offload_bytes, 100);
  EXPECT_DOUBLE_EQ(one_kept.cost_ms(), 0);
  // A link ten times slower: 100 ms a value, dearer than running the 9 ms of ops again.
  BlockLink slow{1.0, 1000, 0};
  const BlockPlan slow_plan = solve_block_plan(g, 0, slow);
  EXPECT_EQ(slow_plan.offload_bytes, 0);
  EXPECT_DOUBLE_EQ(slow_plan.recompute_ms, 9);
  // No room on host: the budget alone.
  BlockLink full_host{0.1, 50, 0};
  EXPECT_EQ(solve_block_plan(g, 0, full_host).offload_bytes, 0);
}

// x -> norm (n, 10 B, 1 ms) -> matmul (h, 40 B, 8 ms) -> gelu (a, 40 B, 1 ms) -> matmul (out).
// Backward reads n, h, a (out is the block's output). Keeping h alone (40 B) lets gelu run again
// from it (1 ms) and leaves norm's n to recompute (1 ms): 2 ms. Keeping a (40 B) instead leaves
// h to its matmul, which needs n: 9 ms. In 50 B: n and h, then a costs the gelu alone.
TEST(BlockPlan, AMlpKeepsItsMatmulsOutputAndRunsTheCheapOpsAgain) {
  BlockGraph g;
  g.ops = {{1, {}}, {8, {0}}, {1, {1}}, {8, {2}}};
  g.values = {{10, 0, true}, {40, 1, true}, {40, 2, true}, {10, 3, false}};
  EXPECT_DOUBLE_EQ(solve_block_plan(g, 0).recompute_ms, 10);
  const BlockPlan p40 = solve_block_plan(g, 40);
  EXPECT_EQ(p40.keep, (std::vector<bool>{false, true, false, false}));
  EXPECT_DOUBLE_EQ(p40.recompute_ms, 2);
  const BlockPlan p50 = solve_block_plan(g, 50);
  EXPECT_EQ(p50.keep, (std::vector<bool>{true, true, false, false}));
  EXPECT_DOUBLE_EQ(p50.recompute_ms, 1);
  EXPECT_DOUBLE_EQ(solve_block_plan(g, 90).recompute_ms, 0);
}

TEST(BlockPlan, TheFrontierRunsFromKeepingAllToKeepingNone) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 20; ++trial) {
    const BlockGraph g = random_block(rng, 10);
    const std::vector<BlockPlan> f = block_plan_frontier(g);
    ASSERT_FALSE(f.empty());
    EXPECT_DOUBLE_EQ(f.front().recompute_ms, 0);
    EXPECT_EQ(f.back().kept_bytes, 0);
    for (size_t i = 1; i < f.size(); ++i) {
      EXPECT_LT(f[i].kept_bytes, f[i - 1].kept_bytes);
      EXPECT_GT(f[i].recompute_ms, f[i - 1].recompute_ms) << "every point on it is worth its bytes";
      // Nothing between two points does better than the larger one's cost.
      EXPECT_DOUBLE_EQ(solve_block_plan(g, f[i - 1].kept_bytes - 1).recompute_ms, f[i].recompute_ms);
    }
  }
}

}  // namespace
}  // namespace ht::schedule

namespace ht::schedule {
namespace {

// A Llama-like block: norm -> qkv product -> attention -> output product (+ residual), norm ->
// gate/up product -> swiglu -> down product (+ residual). torchtitan's per-op policy keeps the
// 1st and 3rd products' outputs (qkv, gate/up) and attention's; the 2nd and 4th products' outputs
// feed additions, which backward does not read, so of them nothing is saved.
BlockGraph llama_like() {
  BlockGraph g;
  g.ops = {{1, {}, "rms_norm"},  {8, {0}, "linear"}, {6, {1}, "attention"}, {4, {2}, "linear"},
           {1, {3}, "add"},      {1, {4}, "rms_norm"}, {8, {5}, "linear"}, {2, {6}, "swiglu"},
           {4, {7}, "linear"},   {1, {8}, "add"}};
  g.values = {{10, 0, true}, {30, 1, true}, {10, 2, true}, {10, 3, false}, {10, 4, true},
              {10, 5, true}, {40, 6, true}, {20, 7, true}, {10, 8, false}, {10, 9, false}};
  return g;
}

TEST(BlockPlan, TorchtitansPerOpPolicyKeepsEverySecondProductAndAttention) {
  const BlockGraph g = llama_like();
  const std::vector<bool> keep = selective_op_keep(g);
  EXPECT_EQ(keep, (std::vector<bool>{false, true, true, false, false, false, true, false, false, false}));
  const BlockPlan sac = plan_with(g, keep);
  EXPECT_EQ(sac.kept_bytes, 80);
  // The norms, swiglu and the residual add run again, and the add needs the output product's
  // result, which nothing kept: 1 + 1 + 2 + 1 + 4.
  EXPECT_DOUBLE_EQ(sac.recompute_ms, 9);
  EXPECT_LE(solve_block_plan(g, sac.kept_bytes).recompute_ms, sac.recompute_ms) << "the solver does no worse in its bytes";
}

TEST(BlockPlan, APlanByKindCountsWhatEachOpsOutputsAreGiven) {
  const BlockGraph g = llama_like();
  const BlockPlan sac = plan_with(g, selective_op_keep(g));
  const std::vector<TensorKindPlan> kinds = plan_by_kind(g, sac);
  ASSERT_EQ(kinds.size(), 5u);
  EXPECT_EQ(kinds[0].kind, "rms_norm");
  EXPECT_EQ(kinds[0].saved, 2);
  EXPECT_EQ(kinds[0].kept, 0);
  EXPECT_EQ(kinds[0].rerun, 2);
  EXPECT_EQ(kinds[0].calls, 2);
  EXPECT_EQ(kinds[1].kind, "linear");
  EXPECT_EQ(kinds[1].saved, 2);
  EXPECT_EQ(kinds[1].saved_bytes, 70);
  EXPECT_EQ(kinds[1].kept_bytes, 70);
  EXPECT_EQ(kinds[1].rerun, 1);  // the output product, for the add
  EXPECT_DOUBLE_EQ(kinds[1].rerun_ms, 4);
  EXPECT_EQ(kinds[1].calls, 4);
  EXPECT_EQ(kinds[3].kind, "add");
  EXPECT_EQ(kinds[3].saved, 1);
  EXPECT_DOUBLE_EQ(kinds[3].rerun_ms, 1);  // the first add, whose output the second norm reads
  EXPECT_EQ(kinds[4].kind, "swiglu");
  EXPECT_EQ(kinds[4].rerun, 1);
}

}  // namespace
}  // namespace ht::schedule

namespace ht::schedule {
namespace {

// Attention makes its output and its statistics; backward reads both. Keeping one of them while
// the other is dropped saves nothing (the op runs again for the other and makes both), so the
// plan keeps neither, whichever order the recorder listed them in.
TEST(BlockPlan, AValueWhoseOpRunsAgainAnywayIsNotKept) {
  for (const bool stats_first : {false, true}) {
    BlockGraph g;
    g.ops = {{40, {}, "linear"}, {6, {0}, "attention"}, {4, {1}, "linear"}};
    g.values = {{30, 0, true}, {10, 1, true}, {10, 1, true}, {10, 2, false}};
    if (stats_first) g.values[1].bytes = 2;
    else g.values[2].bytes = 2;
    // In 32 bytes the projection's output (30, 40 ms to make again) is kept and attention runs
    // again (6 ms); its small output (2) fits beside, and keeping it would save nothing.
    const BlockPlan p = solve_block_plan(g, 32);
    EXPECT_EQ(p.keep, (std::vector<bool>{true, false, false, false})) << "stats first: " << stats_first;
    EXPECT_DOUBLE_EQ(p.recompute_ms, 6);
    EXPECT_EQ(p.kept_bytes, 30);
  }
}

}  // namespace
}  // namespace ht::schedule

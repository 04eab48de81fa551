// The search on synthetic cost tables: the pick is the true optimum for either objective, a rank
// cap of one picks a memory-saving plan, and the sentence states the trade-off in numbers.
#include "planner/search.h"

#include <gmock/gmock.h>

#include <map>
#include <set>
#include <tuple>
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>

namespace ht::test {
namespace {

using ::testing::HasSubstr;

// A made-up machine: compute scales with the rank's samples, every extra rank costs all-reduce
// time; a plan fits its budget (the device) when its model state (100) and activations do, or when
// eviction trades 1.3x the compute for them (down to 10 bytes of activations).
Prediction synthetic(const Plan& p) {
  Prediction r;
  const double per_rank = static_cast<double>(p.micro_batch * p.accumulation);
  r.compute_ms = per_rank * (p.precision == MixedPrecision::kBf16 ? 0.8 : 1.0) + 2.0 * static_cast<double>(p.accumulation);
  r.allreduce_exposed_ms = p.ranks > 1 ? 6.0 : 0.0;
  r.activation_bytes = p.micro_batch * (p.precision == MixedPrecision::kBf16 ? 2 : 4);
  r.peak_bytes = 100 + r.activation_bytes;
  if (p.policy != MemoryPolicy::kNone) {
    r.recompute_ms = 0.3 * r.compute_ms;
    r.evictions = 5;
    r.peak_bytes = std::min<int64_t>(r.peak_bytes, p.budget_bytes);
  }
  r.fits = r.peak_bytes <= p.budget_bytes && p.budget_bytes >= 110;
  r.step_ms = r.compute_ms + r.recompute_ms + r.allreduce_exposed_ms;
  r.samples_per_s = 64.0 / r.step_ms * 1e3;
  r.device_hours_per_epoch = p.ranks * r.step_ms / 3.6e6 * 100;
  return r;
}

const RankedPlan& brute_force_best(const std::vector<RankedPlan>& all, Objective objective) {
  const RankedPlan* best = nullptr;
  for (const RankedPlan& r : all) {
    if (!r.prediction.fits) continue;
    const double v = objective == Objective::kTime ? r.prediction.step_ms : r.prediction.device_hours_per_epoch;
    const double b = best == nullptr ? std::numeric_limits<double>::infinity()
                                     : (objective == Objective::kTime ? best->prediction.step_ms
                                                                      : best->prediction.device_hours_per_epoch);
    if (v < b) best = &r;
  }
  return *best;
}

TEST(Search, CandidatesCoverRanksMicroBatchesPrecisionsAndPolicies) {
  SearchOptions o;
  o.ranks = {1, 2, 3, 4};
  const std::vector<Plan> plans = candidate_plans(64, 1 << 20, o);
  for (const Plan& p : plans) {
    EXPECT_NE(p.ranks, 3) << "64 does not divide among 3 ranks";
    EXPECT_EQ(p.micro_batch * p.accumulation * p.ranks, 64);
    EXPECT_EQ(p.budget_bytes, 1 << 20);
  }
  // ranks 1, 2, 4 x accumulation 1..32 (6, 6, 5 of them) x 2 precisions x 2 policies
  EXPECT_EQ(plans.size(), (6u + 6u + 5u) * 2 * 2);
  EXPECT_TRUE(candidate_plans(64, 0, o).size() * 2 == plans.size()) << "no budget: no eviction plans";
}

// On CPU ranks (SearchOptions::block_offload) per_block comes with and without offload: at every
// share of the ladder, and with offload keeping nothing on the device; never with tensor
// parallelism or ZeRO-3 (the engine refuses offload under ZeRO-3).
TEST(Search, PerBlockPlansOffloadWhereTheHostLinkIs) {
  SearchOptions o;
  o.ranks = {1, 2};
  o.precisions = {MixedPrecision::kOff};
  o.policies = {MemoryPolicy::kPerBlock};
  o.shards = {ShardLevel::kNone, ShardLevel::kParameters};
  o.max_accumulation = 1;
  auto count = [&](bool offload) {
    std::map<std::pair<int, ShardLevel>, std::multiset<double>> shares;
    for (const Plan& p : candidate_plans(16, 1 << 20, o))
      if (p.block_offload == offload) shares[{p.ranks, p.shard}].insert(p.block_keep_share);
    return shares;
  };
  EXPECT_TRUE(count(true).empty()) << "offload only where the search is told the host link is there";
  o.block_offload = true;
  const auto offloading = count(true);
  const std::multiset<double> ladder{0.75, 0.5, 0.25, 0.0};
  EXPECT_EQ(offloading.at({1, ShardLevel::kNone}), ladder);
  EXPECT_EQ(offloading.at({2, ShardLevel::kNone}), ladder);
  EXPECT_EQ(offloading.count({2, ShardLevel::kParameters}), 0u) << "not under ZeRO-3";
  EXPECT_EQ(count(false).at({1, ShardLevel::kNone}), (std::multiset<double>{0.75, 0.5, 0.25}));
  o.splits = {RankSplit{2, 1}};
  o.ranks = {2};
  EXPECT_TRUE(count(true).empty()) << "not with tensor parallelism";
}

TEST(Search, PipelineStagesDivideTheRanksAndHaveAMicroBatchPerStage) {
  SearchOptions o;
  o.ranks = {1, 2, 4};
  o.stages = {1, 2};
  o.precisions = {MixedPrecision::kOff};
  o.policies = {MemoryPolicy::kNone, MemoryPolicy::kDtr};
  const std::vector<Plan> plans = candidate_plans(64, 1 << 20, o);
  int piped = 0;
  for (const Plan& p : plans) {
    if (p.stages == 1) continue;
    ++piped;
    EXPECT_EQ(p.stages, 2);
    EXPECT_NE(p.devices(), 1) << "one rank cannot hold two stages";
    EXPECT_GE(p.accumulation, p.stages) << "a pipeline needs a micro-batch per stage";
    EXPECT_EQ(p.policy, MemoryPolicy::kNone) << "stages are searched without eviction";
    EXPECT_EQ(p.micro_batch * p.accumulation * p.ranks, 64);
  }
  EXPECT_GT(piped, 0);
  EXPECT_NE(describe_plan(plans.back()).find("stages"), std::string::npos);
}

// dp x tp x pp: a tensor-parallel group divides the ranks with the stages; it is searched with
// sharding within its replicas and with DTR alone of the memory policies (what the trainer
// composes it with).
TEST(Search, TensorParallelGroupsDivideTheRanksWithTheStages) {
  SearchOptions o;
  o.ranks = {1, 2, 4, 8};
  o.stages = {1, 2};
  o.splits = {RankSplit{1, 1}, RankSplit{2, 1}, RankSplit{4, 1}};
  o.precisions = {MixedPrecision::kOff};
  o.policies = {MemoryPolicy::kNone, MemoryPolicy::kDtr, MemoryPolicy::kStatic};
  o.shards = {ShardLevel::kNone, ShardLevel::kOptimizer};
  const std::vector<Plan> plans = candidate_plans(64, 1 << 20, o);
  bool three_axes = false, sharded = false;
  for (const Plan& p : plans) {
    if (p.tensor == 1) continue;
    EXPECT_TRUE(p.sequence_parallel);
    EXPECT_EQ(p.devices() % (p.tensor * p.stages), 0);
    EXPECT_FALSE(plans_statically(p.policy));
    sharded |= p.shard == ShardLevel::kOptimizer;
    EXPECT_EQ(p.micro_batch * p.accumulation * p.ranks, 64) << "the replicas share the global batch";
    three_axes |= p.ranks == 2 && p.tensor == 2 && p.stages == 2;
  }
  EXPECT_TRUE(three_axes) << "8 ranks as 2 replicas x 2-way tensor x 2 stages";
  EXPECT_TRUE(sharded) << "the replicas of a tensor-parallel job shard their state";
  Plan p;
  p.tensor = 4;
  p.sequence_parallel = true;
  EXPECT_NE(describe_plan(p).find("split 4 ways with sequence parallelism"), std::string::npos);
}

// dp x cp x tp x pp: each split of a replica's ranks is searched with its own profile; a
// context group divides the ranks with the tensor group and the stages, shares its replicas'
// state (ZeRO over dp x cp: one replica's context ranks shard it too) and composes with stages.
TEST(Search, ContextGroupsAreSplitsOfTheirOwnAndComposeWithStages) {
  SearchOptions o;
  o.ranks = {4, 8};
  o.stages = {1, 2};
  o.splits = {RankSplit{1, 1}, RankSplit{1, 2}, RankSplit{2, 2}};
  o.precisions = {MixedPrecision::kOff};
  o.policies = {MemoryPolicy::kNone, MemoryPolicy::kFull, MemoryPolicy::kStatic};
  o.shards = {ShardLevel::kNone, ShardLevel::kOptimizer};
  std::set<std::tuple<int, int, int, int>> layouts;  // replicas, context, tensor, stages
  bool sharded_alone = false;
  for (const Plan& p : candidate_plans(64, 1 << 20, o)) {
    layouts.insert({p.ranks, p.context, p.tensor, p.stages});
    EXPECT_EQ(p.devices() % (p.context * p.tensor * p.stages), 0);
    EXPECT_EQ(p.micro_batch * p.accumulation * p.ranks, 64) << "a replica's context ranks train its samples";
    if (p.context > 1) EXPECT_FALSE(plans_statically(p.policy)) << "the ranks' chunks evict apart";
    sharded_alone |= p.context == 2 && p.ranks == 1 && p.shard == ShardLevel::kOptimizer;
  }
  EXPECT_EQ(layouts.count({2, 2, 1, 1}), 1u);
  EXPECT_EQ(layouts.count({1, 2, 2, 2}), 1u) << "8 ranks as 2 context x 2 tensor x 2 stages";
  EXPECT_EQ(layouts.count({1, 2, 1, 2}), 1u);
  EXPECT_EQ(layouts.count({2, 1, 2, 1}), 0u) << "a split not asked for has no profile";
  EXPECT_TRUE(sharded_alone) << "one replica's context ranks shard its state";
}

// The context group's exchange is part of the split (a profile each: what a layer's attention
// holds differs): one size with both exchanges makes plans of each, and each plan's split names
// its own profile; one context rank exchanges nothing, whatever a plan says.
TEST(Search, EachExchangeOfAContextSizeIsASplitOfItsOwn) {
  SearchOptions o;
  o.ranks = {4};
  o.splits = {RankSplit{1, 1}, RankSplit{1, 2, ContextExchange::kRing}, RankSplit{1, 2, ContextExchange::kAllGather}};
  o.precisions = {MixedPrecision::kOff};
  o.policies = {MemoryPolicy::kNone};
  std::set<RankSplit> seen;
  for (const Plan& p : candidate_plans(64, 1 << 20, o)) {
    seen.insert(p.split());
    if (p.context > 1) EXPECT_EQ(p.split().exchange, p.context_exchange);
  }
  EXPECT_EQ(seen, std::set<RankSplit>(o.splits.begin(), o.splits.end()));
  Plan one;
  one.context_exchange = ContextExchange::kAllGather;
  EXPECT_EQ(one.split(), RankSplit{}) << "c = 1 keys the one profile of its tensor size";
}

TEST(Search, PicksTheTrueOptimumForEitherObjective) {
  SearchOptions o;
  o.ranks = {1, 2, 4, 8};
  const std::vector<Plan> plans = candidate_plans(64, 200, o);
  for (Objective objective : {Objective::kTime, Objective::kCost}) {
    const std::vector<RankedPlan> ranked = rank_plans(plans, synthetic, objective);
    const RankedPlan& best = brute_force_best(ranked, objective);
    ASSERT_TRUE(ranked[0].prediction.fits);
    EXPECT_EQ(ranked[0].prediction.step_ms, best.prediction.step_ms);
    EXPECT_EQ(ranked[0].prediction.device_hours_per_epoch, best.prediction.device_hours_per_epoch);
    for (size_t i = 1; i < ranked.size(); ++i) {
      if (!ranked[i].prediction.fits) {
        for (size_t j = i; j < ranked.size(); ++j) EXPECT_FALSE(ranked[j].prediction.fits) << "fitting plans first";
        break;
      }
    }
  }
  // Time: eight ranks (8 samples each) beat one; cost: one rank, since all-reduce is pure overhead.
  EXPECT_EQ(rank_plans(plans, synthetic, Objective::kTime)[0].plan.ranks, 8);
  EXPECT_EQ(rank_plans(plans, synthetic, Objective::kCost)[0].plan.ranks, 1);
}

TEST(Search, TheRankingDoesNotDependOnTheThreadsThatPredictIt) {
  SearchOptions o;
  o.ranks = {1, 2, 4, 8};
  o.shards = {ShardLevel::kNone, ShardLevel::kOptimizer, ShardLevel::kGradients, ShardLevel::kParameters};
  o.splits = {RankSplit{1, 1}, RankSplit{2, 1}, RankSplit{4, 1}};
  o.stages = {1, 2};
  const std::vector<Plan> plans = candidate_plans(64, 200, o);
  ASSERT_GT(plans.size(), 4u * 64u) << "enough plans for four threads";
  const std::vector<RankedPlan> one = rank_plans(plans, synthetic, Objective::kTime, 1);
  const std::vector<RankedPlan> four = rank_plans(plans, synthetic, Objective::kTime, 4);
  ASSERT_EQ(one.size(), four.size());
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_EQ(describe_plan(one[i].plan), describe_plan(four[i].plan)) << "rank " << i;
    EXPECT_EQ(one[i].prediction.step_ms, four[i].prediction.step_ms) << "rank " << i;
  }
}

TEST(Search, ARankCapOfOnePicksAMemorySaver) {
  SearchOptions o;
  o.ranks = {1};
  const std::vector<RankedPlan> ranked = rank_plans(candidate_plans(64, 200, o), synthetic, Objective::kTime);
  const Plan& pick = ranked[0].plan;
  ASSERT_TRUE(ranked[0].prediction.fits);
  // 64 samples at once need 100 + 4 x 64 bytes: the pick accumulates, or evicts, or halves precision.
  EXPECT_TRUE(pick.accumulation > 1 || pick.policy != MemoryPolicy::kNone || pick.precision == MixedPrecision::kBf16);
  EXPECT_LE(ranked[0].prediction.peak_bytes, 200);
}

TEST(Search, TheSentenceStatesTheTradeOffInNumbers) {
  SearchOptions o;
  o.ranks = {1, 2};
  const std::vector<RankedPlan> ranked = rank_plans(candidate_plans(64, 200, o), synthetic, Objective::kTime);
  ASSERT_EQ(ranked[0].plan.ranks, 2);
  const std::string why = why_it_wins(ranked, Objective::kTime);
  EXPECT_THAT(why, HasSubstr("2 ranks give "));
  EXPECT_THAT(why, HasSubstr("x the throughput of the best 1-rank plan"));
  EXPECT_THAT(why, HasSubstr("x the device-hours"));
  EXPECT_THAT(why, HasSubstr("Recomputation instead"));
  o.ranks = {1};
  EXPECT_EQ(why_it_wins(rank_plans(candidate_plans(64, 100, o), synthetic, Objective::kTime), Objective::kTime), "")
      << "nothing fits in 100: no sentence";
}

// AdaPipe's per-stage plan (predict_stage_keeps): from the highest uniform share that fits, the
// stages raised while the step gets faster and every stage fits.
TEST(Search, PerStageSharesRaiseTheStagesThatHaveRoom) {
  Plan plan;
  plan.stages = 2;
  plan.policy = MemoryPolicy::kPerBlock;
  plan.block_keep_by_stage = true;
  auto predict = [&](Plan& q) {
    Prediction p;
    p.usable_bytes = 100;
    const std::vector<int64_t> base{150, 90};  // stage 0 holds two micro-batches in flight
    for (size_t r = 0; r < 2; ++r) {
      p.stage_peak_bytes.push_back(static_cast<int64_t>(static_cast<double>(base[r]) * (0.5 + 0.5 * q.stage_block_keep[r])));
      p.step_ms += 10 * (1 - q.stage_block_keep[r]);  // what each stage recomputes
    }
    p.peak_bytes = *std::max_element(p.stage_peak_bytes.begin(), p.stage_peak_bytes.end());
    p.fits = p.peak_bytes <= p.usable_bytes;
    return p;
  };
  const Prediction p = predict_stage_keeps(plan, predict);
  EXPECT_TRUE(p.fits);
  EXPECT_EQ(plan.stage_block_keep, (std::vector<double>{0.25, 0.75})) << "stage 0 at 0.25 (93 bytes), stage 1 raised";
  EXPECT_EQ(plan.block_keep_share, 0.25) << "the first stage's";
  EXPECT_DOUBLE_EQ(p.step_ms, 10);
  EXPECT_EQ(policy_cell(plan), "per_block 25/75%");
  // Where even full recomputation does not fit: a plan that does not fit.
  Plan tight;
  tight.stages = 2;
  tight.policy = MemoryPolicy::kPerBlock;
  auto never = [&](Plan& q) {
    Prediction p = predict(q);
    p.fits = false;
    return p;
  };
  EXPECT_FALSE(predict_stage_keeps(tight, never).fits);
  EXPECT_EQ(tight.stage_block_keep.size(), 2u);
}

}  // namespace
}  // namespace ht::test

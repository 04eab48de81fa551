// Sharding in the cost model (planner/shard_terms.h): the state per rank to the byte, the ZeRO
// formula for this project's precision as a check, the optimizer's temporaries per piece, the
// all-gather's time, and the levels the search offers.
#include "planner/search.h"
#include "planner/shard_terms.h"

#include <gtest/gtest.h>

namespace ht {
namespace {

// A model of two buckets (reduction order: the last layer first), fp32, AdamW (8 bytes of state
// per element), its optimizer's temporaries two copies of its largest parameter.
ModelProfile adamw_profile() {
  ModelProfile p;
  p.buckets = {{10, 4000}, {600, 2000}};
  p.parameters = 10 + 4000 + 600 + 2000;
  p.parameter_bytes = arena_bytes(4 * p.parameters);
  p.gradient_bytes = arena_bytes(4 * p.parameters);
  p.optimizer_state_bytes = arena_bytes(8 * p.parameters);
  return p;
}

Prediction whole(const ModelProfile& profile, int64_t activations) {
  Prediction p;
  p.model_bytes = profile.parameter_bytes;
  p.gradient_bytes = profile.gradient_bytes;
  p.optimizer_state_bytes = profile.optimizer_state_bytes;
  p.activation_bytes = activations;
  p.optimizer_working_bytes = 2 * arena_bytes(4 * 4000);
  p.peak_bytes = p.model_bytes + p.gradient_bytes + p.optimizer_state_bytes + std::max(activations, p.optimizer_working_bytes);
  return p;
}

TEST(ShardTerms, StatePerRankIsTheFullestRanksShareToTheByte) {
  const ModelProfile profile = adamw_profile();
  EXPECT_EQ(state_bytes_per_element(profile), 8);
  EXPECT_EQ(shard_elements(profile.buckets, 1), 6610);
  EXPECT_EQ(shard_elements(profile.buckets, 4), 1003 + 650) << "ceil of each bucket's quarter";
  Plan plan;
  plan.ranks = 4;
  plan.shard = ShardLevel::kOptimizer;
  Prediction p = whole(profile, 100000);  // activations dominate: the peak loses exactly the state saved
  const int64_t before = p.peak_bytes;
  shard_memory_terms(profile, plan, p);
  EXPECT_EQ(p.optimizer_state_bytes, arena_bytes(8 * (1003 + 650)));
  EXPECT_EQ(p.peak_bytes, before - (arena_bytes(8 * 6610) - arena_bytes(8 * 1653)));
  // ZeRO's first stage, with this project's fp32 parameters and gradients: 4P + 4P + 8P/N, up to
  // the uneven split (at most one element a bucket) and the arena's 64-byte rounding.
  const double formula = 4.0 * 6610 + 4.0 * 6610 + 8.0 * 6610 / 4;
  const double ours = static_cast<double>(p.model_bytes + p.gradient_bytes + p.optimizer_state_bytes);
  EXPECT_NEAR(ours, formula, 8.0 * 2 + 3 * 64);
}

TEST(ShardTerms, TheOptimizersTemporariesShrinkWithTheLargestPiece) {
  const ModelProfile profile = adamw_profile();
  Plan plan;
  plan.ranks = 4;
  plan.shard = ShardLevel::kOptimizer;
  Prediction p = whole(profile, 0);  // the optimizer's temporaries set the peak
  shard_memory_terms(profile, plan, p);
  // Bucket 0 (4010 elements): ranks own 1003, 1003, 1002, 1002; the 4000-element parameter is cut
  // into pieces of at most 1003 (rank 1 and rank 0's 993 after the 10-element one).
  EXPECT_EQ(p.optimizer_working_bytes, 2 * arena_bytes(4 * 1003));
  EXPECT_EQ(p.peak_bytes, p.model_bytes + p.gradient_bytes + p.optimizer_state_bytes + p.optimizer_working_bytes);
  Plan none = plan;
  none.shard = ShardLevel::kNone;
  Prediction q = whole(profile, 0);
  const Prediction unchanged = q;
  shard_memory_terms(profile, none, q);
  EXPECT_EQ(q.peak_bytes, unchanged.peak_bytes) << "no sharding, no change";
}

TEST(ShardTerms, AllGatherIsARingOfRanksMinusOneSteps) {
  Machine m;
  m.devices_per_node = 8;
  m.intra_node_gbps = 10;
  m.intra_node_latency_us = 5;
  EXPECT_EQ(allgather_ms(m, 1, 1 << 20), 0.0);
  // 4 ranks, 40 MB: 3 steps of 10 MB at 10 GB/s (1 ms each) and 5 us each.
  EXPECT_NEAR(allgather_ms(m, 4, 40'000'000), 3 * (1.0 + 0.005), 1e-9);
}

TEST(ShardTerms, TheSearchOffersLevelsToSeveralReplicasWithoutStages) {
  SearchOptions options;
  options.ranks = {1, 2, 4};
  options.stages = {1, 2};
  options.precisions = {MixedPrecision::kOff};
  options.policies = {MemoryPolicy::kNone};
  options.shards = {ShardLevel::kNone, ShardLevel::kOptimizer};
  options.max_accumulation = 1;
  int sharded = 0;
  for (const Plan& p : candidate_plans(8, 0, options)) {
    if (p.shard == ShardLevel::kNone) continue;
    ++sharded;
    EXPECT_GT(p.ranks, 1);
    EXPECT_EQ(p.stages, 1);
  }
  EXPECT_EQ(sharded, 2) << "2 and 4 replicas";
}

}  // namespace
}  // namespace ht

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

// ZeRO-3: three blocks of one bucket each, block 0's bucket read by the last block too (a tied
// embedding). A rank keeps its parameter shards; while forward and backward run, the buckets
// gathered at once come on top: where backward reads every weight (fp32) the most any block reads
// with the tied bucket held (block 1's 4000 + block 0's 500), where it reads none only what the
// last block left gathered as forward ended.
TEST(ShardTerms, ParametersAreTheRanksShardsPlusTheBlocksGathered) {
  ModelProfile profile = adamw_profile();
  profile.block_buckets = {{10, 100}, {4000}, {500}};  // reduction order: last block's first
  profile.block_bucket_uses = {{2}, {1}, {0, 2}};      // per block, in block order
  profile.buckets = {{10, 100, 4000, 500}};
  profile.parameters = 4610;
  profile.parameter_bytes = arena_bytes(4 * 4610);
  profile.gradient_bytes = arena_bytes(4 * 4610);
  profile.optimizer_state_bytes = arena_bytes(8 * 4610);
  EXPECT_EQ(gathered_parameter_bytes(profile, 4, nullptr), arena_bytes(4 * 4000) + arena_bytes(4 * 500))
      << "backward reads every weight (fp32): the most a block reads, the tied bucket held";
  const std::vector<size_t> none;
  EXPECT_EQ(gathered_parameter_bytes(profile, 4, &none), arena_bytes(4 * 110) + arena_bytes(4 * 500))
      << "backward reads only kept copies: what the last block left gathered";
  const std::vector<size_t> norms{1};  // block 1's bucket holds a weight read in fp32 (a norm's)
  EXPECT_EQ(gathered_parameter_bytes(profile, 4, &norms), arena_bytes(4 * 4000));
  Plan plan;
  plan.ranks = 2;
  plan.shard = ShardLevel::kParameters;
  Prediction p = whole(profile, 100000);
  shard_memory_terms(profile, plan, p);
  // Shards of 55 + 2000 + 250 elements a rank, fp32, one tensor a bucket; the parameters gone.
  const int64_t shards = arena_bytes(4 * 55) + arena_bytes(4 * 2000) + arena_bytes(4 * 250);
  EXPECT_EQ(p.model_bytes, shards);
  EXPECT_EQ(p.optimizer_state_bytes, arena_bytes(8 * 2305));
  EXPECT_EQ(p.peak_bytes, p.model_bytes + p.gradient_bytes + p.optimizer_state_bytes + 100000 +
                              gathered_parameter_bytes(profile, 4, nullptr));
  // Two all-gathers of every bucket a micro-batch (forward and backward), none after the step.
  Machine m;
  m.devices_per_node = 8;
  m.intra_node_gbps = 10;
  m.intra_node_latency_us = 0;
  plan.accumulation = 3;
  Prediction t;
  shard_time_terms(profile, m, plan, t);
  EXPECT_NEAR(t.gather_ms, 6 * allgather_ms(m, 2, 4 * 4610), 1e-12);
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

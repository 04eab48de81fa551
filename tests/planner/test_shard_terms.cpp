// Sharding in the cost model (planner/shard_terms.h): the state per rank to the byte, the ZeRO
// formula for this project's precision as a check, the optimizer's temporaries per piece, the
// all-gather's time, and the levels the search offers.
#include "planner/gradient_blocks.h"
#include "planner/search.h"
#include "planner/shard_terms.h"
#include "planner/weight_copy_terms.h"
#include "parallel/shard_layout.h"

#include <gmock/gmock.h>
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
  // Prefetching one block: backward holds a block's buckets and the one before it.
  EXPECT_EQ(gathered_parameter_bytes(profile, 4, nullptr, 1),
            arena_bytes(4 * 110) + arena_bytes(4 * 500) + arena_bytes(4 * 4000))
      << "the last block's, the tied one, and block 1's gathered ahead";
  EXPECT_EQ(gathered_parameter_bytes(profile, 4, &norms, 1), arena_bytes(4 * 4000))
      << "ahead only what backward reads again";
  // 16-bit gathers: the buckets holding a cast weight gather 2 bytes an element, in backward too
  // where backward reads the casts (its saved copies are views of them); a weight read in fp32
  // (block 1's norm, 64 elements) is gathered alone beside them; so is the embedding's table
  // (bucket 2, 500 elements: the lookup reads it in fp32, the tied output layer its copy).
  // Backward gathers again the copies whose casts the tape saved and the fp32 weights it saved (the
  // norm; not the table, which the lookup does not save).
  ProfilePoint copies;
  copies.half_read_buckets = {0, 1, 2};
  copies.backward_copy_buckets = {0, 1, 2};
  copies.backward_fp32_buckets = {1};
  copies.fp32_read_elements = {{1, 64}, {2, 500}};
  EXPECT_EQ(gathered_parameter_bytes(profile, 4, &norms, 0, &copies),
            arena_bytes(2 * 4000) + arena_bytes(4 * 64) + arena_bytes(2 * 500))
      << "block 1's copies and norm, with the tied bucket's copies held (not its fp32 table)";
  copies.backward_fp32_buckets = {1, 2};
  EXPECT_EQ(gathered_parameter_bytes(profile, 4, &norms, 0, &copies),
            arena_bytes(2 * 4000) + arena_bytes(4 * 64) + arena_bytes(2 * 500) + arena_bytes(4 * 500))
      << "a table backward reads in fp32 held too";
  copies.backward_fp32_buckets = {1};
  copies.half_read_buckets = {0, 1};
  copies.backward_copy_buckets = {0, 1};
  EXPECT_EQ(gathered_parameter_bytes(profile, 4, &none, 0, &copies), arena_bytes(2 * 4000) + arena_bytes(4 * 64))
      << "an untied table (no weight of its bucket cast) is gathered in fp32 in forward only";
  // Prefetching one block in backward: block 1's copies, gathered again while block 2 computes,
  // only where backward reads them (a first layer's input needs no gradient: its copy is not saved).
  EXPECT_EQ(gathered_parameter_bytes(profile, 4, &none, 1, &copies),
            arena_bytes(2 * 110) + arena_bytes(2 * 4000) + arena_bytes(4 * 64));
  copies.backward_copy_buckets = {0};
  EXPECT_EQ(gathered_parameter_bytes(profile, 4, &none, 1, &copies), arena_bytes(2 * 110) + arena_bytes(4 * 500))
      << "block 1's copies not read again: forward's end (the last block's, the table) is the most";
  Plan plan;
  plan.ranks = 2;
  plan.shard = ShardLevel::kParameters;
  plan.prefetch = 0;
  Prediction p = whole(profile, 100000);
  shard_memory_terms(profile, plan, p);
  // Shards of 55 + 2000 + 250 elements a rank, fp32, one tensor a bucket; the parameters gone.
  const int64_t shards = arena_bytes(4 * 55) + arena_bytes(4 * 2000) + arena_bytes(4 * 250);
  EXPECT_EQ(p.model_bytes, shards);
  EXPECT_EQ(p.optimizer_state_bytes, arena_bytes(8 * 2305));
  EXPECT_EQ(p.peak_bytes, p.model_bytes + p.gradient_bytes + p.optimizer_state_bytes + 100000 +
                              gathered_parameter_bytes(profile, 4, nullptr));
  plan.prefetch = 1;
  Prediction ahead = whole(profile, 100000);
  shard_memory_terms(profile, plan, ahead);
  EXPECT_EQ(ahead.peak_bytes - p.peak_bytes, arena_bytes(4 * 110))
      << "prefetched: the last block's bucket beside block 1's and the tied one, as backward begins";
  Plan managed = plan;
  managed.policy = MemoryPolicy::kDtr;
  managed.budget_bytes = 1 << 30;
  EXPECT_EQ(prefetch_depth(managed), 0) << "under a budget with eviction the memory manager decides";
}

// The gathered buckets placed along a step: 100 bytes kept from block 0's forward, 100000 from
// block 2's until its backward. Forward's early blocks hold much gathered where little else
// is in use; what counts is the sum at each kernel: as backward begins, the last block's buckets
// (the tied one among them), with prefetch block 1's too. A sharded gradient block comes where its
// bucket's first gradient is accumulated, after the kernel that made it.
// ZeRO-1 and ZeRO-2 keeping 16-bit copies shard the fp32 masters (planner/weight_copy_terms.h,
// shards_masters): the bucketed weights give way to the rank's fp32 shards, the weights read in
// fp32 stay whole (with their slots in the 16-bit buckets, at ZeRO-2 only in buckets whose copies
// are read: block 1's norm, not the embedding's bucket 2 read in fp32 alone; at ZeRO-1, cut by
// size, every bucket is taken to be read in 16 bits), and the gather after the step is the copies'
// 2 bytes an element and each bucket's fp32 reads.
TEST(ShardTerms, MastersShardedAtZeroOneAndTwoKeepTheRanksShards) {
  ModelProfile profile = adamw_profile();
  profile.block_buckets = {{10, 100}, {4000}, {500}};
  profile.block_bucket_uses = {{2}, {1}, {0, 2}};
  ProfilePoint point;
  point.precision = MixedPrecision::kBf16;
  point.half_read_buckets = {0, 1};
  point.fp32_read_elements = {{1, 64}, {2, 500}};
  profile.points.push_back(point);
  Plan plan;
  plan.ranks = 2;
  plan.precision = MixedPrecision::kBf16;
  plan.shard = ShardLevel::kGradients;
  ASSERT_TRUE(shards_masters(plan)) << "kept by auto: no budget";
  EXPECT_EQ(masters_gathered_bytes(profile, plan), 2 * 64 + arena_bytes(4 * 64) + arena_bytes(4 * 500));
  Plan budget = plan;
  budget.budget_bytes = int64_t{1} << 30;
  budget.compute_weights = ComputeWeightsMode::kKept;
  EXPECT_TRUE(shards_masters(budget)) << "a budget that does not evict";
  budget.policy = MemoryPolicy::kDtr;
  EXPECT_FALSE(shards_masters(budget)) << "a budget that evicts keeps the fp32 weights whole";
  Plan stages = plan;
  stages.stages = 2;
  EXPECT_FALSE(shards_masters(stages));
  Plan cast = plan;
  cast.compute_weights = ComputeWeightsMode::kCast;
  EXPECT_FALSE(shards_masters(cast));
  // The peak: the bucketed weights' 4 bytes give way to the fullest rank's shards and the fp32 reads.
  Prediction whole_weights = whole(profile, 100000);
  Plan unsharded_masters = plan;
  unsharded_masters.compute_weights = ComputeWeightsMode::kCast;
  shard_memory_terms(profile, unsharded_masters, whole_weights);
  Prediction sharded = whole(profile, 100000);
  shard_memory_terms(profile, plan, sharded);
  int64_t shards = 0, bucketed = 0;
  for (const std::vector<int64_t>& members : profile.block_buckets) {
    shards += arena_bytes(4 * shard_bucket(members, 2).counts.front());
    for (int64_t n : members) bucketed += n;
  }
  EXPECT_EQ(sharded.model_bytes,
            profile.parameter_bytes - arena_bytes(4 * bucketed) + masters_gathered_bytes(profile, plan) + shards);
  EXPECT_EQ(whole_weights.peak_bytes - sharded.peak_bytes, whole_weights.model_bytes - sharded.model_bytes);
  Plan zero1 = plan;
  zero1.shard = ShardLevel::kOptimizer;
  EXPECT_EQ(masters_gathered_bytes(profile, zero1), 2 * (64 + 500) + arena_bytes(4 * 64) + arena_bytes(4 * 500))
      << "buckets cut by size: each taken to hold a weight read in 16 bits";
  // The gather: 2 bytes an element, and a collective for each bucket's fp32 reads.
  Machine machine;
  Prediction t;
  shard_time_terms(profile, machine, plan, t);
  const int64_t elements = 10 + 100 + 4000 + 500;
  EXPECT_DOUBLE_EQ(t.gather_ms, allgather_ms(machine, 2, 2 * elements, 1) + allgather_ms(machine, 2, 4 * 64, 1) +
                                    allgather_ms(machine, 2, 4 * 500, 1));
}

TEST(ShardTerms, GatheredParametersArePlacedAlongTheStep) {
  ModelProfile profile = adamw_profile();
  profile.block_buckets = {{10, 100}, {4000}, {500}};
  profile.block_bucket_uses = {{2}, {1}, {0, 2}};
  StepTrace trace;
  trace.tensors = {TraceTensor{100, 0, true}, TraceTensor{100000, 2, true}, TraceTensor{1000, -1, false}};
  using K = TraceEvent::Kind;
  for (auto [block, backward] : {std::pair{0, false}, {1, false}, {2, false}, {2, true}, {1, true}}) {
    TraceKernel k;
    k.block = block;
    k.backward = backward;
    trace.kernels.push_back(k);
  }
  trace.kernels[3].gradient_buckets = {0, 2};  // block 2's and the tied one
  trace.kernels[4].gradient_buckets = {1};
  trace.events = {{K::kKernelBegins, 0}, {K::kAllocated, 0},    {K::kKernelEnds, 0}, {K::kKernelBegins, 1},
                  {K::kKernelEnds, 1},   {K::kKernelBegins, 2}, {K::kAllocated, 1},  {K::kKernelEnds, 2},
                  {K::kKernelBegins, 3}, {K::kAllocated, 2},    {K::kKernelEnds, 3}, {K::kFreed, 2},
                  {K::kFreed, 1},        {K::kKernelBegins, 4}, {K::kKernelEnds, 4}};
  const int64_t last = arena_bytes(4 * 110) + arena_bytes(4 * 500), middle = arena_bytes(4 * 4000);
  EXPECT_EQ(gathered_parameter_peak_bytes(profile, trace, 4, nullptr, 0), last)
      << "block 1's 16000 bytes come where only 100 are in use";
  // Sharded gradients: the blocks of buckets 0 and 2 (as large as `last`) come as the kernel that
  // made their first gradients ends, its 1000 bytes of them still there (the tape copies them into
  // the blocks, then frees them), beside the 100100 it kept; the tied bucket's stays until
  // backward's end (the last bucket, reduce-scattered last), bucket 0's until block 1 begins.
  EXPECT_EQ(gathered_parameter_peak_bytes(profile, trace, 4, nullptr, 0, 4), 2 * last);
  EXPECT_EQ(gathered_parameter_peak_bytes(profile, trace, 4, nullptr, 1), last + middle)
      << "backward's first block holds the one before it, gathered ahead";
  EXPECT_EQ(gathered_parameter_peak_bytes(profile, StepTrace{}, 4, nullptr, 1),
            gathered_parameter_bytes(profile, 4, nullptr, 1))
      << "no trace: at the activations' peak";
}

// Two blocks forward, then backward from block 1 (its kernel makes bucket 0's gradients) to
// block 0 (bucket 1's), whose kernel alone holds `bytes` of activations.
StepTrace two_block_step(int64_t bytes) {
  StepTrace trace;
  trace.tensors = {TraceTensor{bytes, 0, true}};
  using K = TraceEvent::Kind;
  for (auto [block, backward] : {std::pair{0, false}, {1, false}, {1, true}, {0, true}}) {
    TraceKernel k;
    k.block = block;
    k.backward = backward;
    trace.kernels.push_back(k);
  }
  trace.kernels[2].gradient_buckets = {0};
  trace.kernels[3].gradient_buckets = {1};
  trace.events = {{K::kKernelBegins, 0}, {K::kKernelEnds, 0}, {K::kKernelBegins, 1}, {K::kKernelEnds, 1},
                  {K::kKernelBegins, 2}, {K::kKernelEnds, 2}, {K::kKernelBegins, 3}, {K::kAllocated, 0},
                  {K::kKernelEnds, 3},   {K::kFreed, 0}};
  return trace;
}

// Overlapped reduce-scatters (GradientShards::set_overlap): a bucket's block stays until the next
// bucket's reduce-scatter starts, so it is still there while the block before it computes.
TEST(ShardTerms, AnOverlappedReduceScatterHoldsItsBlockUntilTheNextStarts) {
  ModelProfile profile = adamw_profile();
  profile.block_buckets = {{1000}, {1000}};  // reduction order: block 1's bucket first
  profile.block_bucket_uses = {{1}, {0}};
  const StepTrace trace = two_block_step(50000);
  const int64_t bucket = arena_bytes(4 * 1000);
  // Block 0's backward holds its gathered bucket beside its 50000 bytes, and bucket 1's gradient
  // block is made before they are freed; bucket 0's was reduce-scattered as it began, or,
  // overlapped, is held until backward ends.
  EXPECT_EQ(gathered_parameter_peak_bytes(profile, trace, 4, nullptr, 0, 4, false), 2 * bucket);
  EXPECT_EQ(gathered_parameter_peak_bytes(profile, trace, 4, nullptr, 0, 4, true), 3 * bucket);
  // From the second micro-batch on, bucket 0's reduce-scatter fills a part of its shard's size
  // beside them (as ZeRO-2's walk, gradient_block_steps).
  const int64_t part = 2048;
  EXPECT_EQ(gathered_parameter_peak_bytes(profile, trace, 4, nullptr, 0, 4, true, {part, part}), 3 * bucket + part);
  // Backward's end counts: the last kernel's gradients make bucket 1's block after it, while
  // bucket 0's is still in flight and bucket 1 still gathered (freed when its reduce-scatter starts).
  EXPECT_EQ(gathered_parameter_peak_bytes(profile, two_block_step(1024), 4, nullptr, 0, 4, true), 3 * bucket);
  Plan plan;
  plan.ranks = 2;
  plan.shard = ShardLevel::kParameters;
  EXPECT_TRUE(reduce_scatters_overlap(plan)) << "prefetched gathers: the worker runs them";
  plan.prefetch = 0;
  EXPECT_FALSE(reduce_scatters_overlap(plan)) << "gathers on the computing thread";
  plan.shard = ShardLevel::kGradients;
  EXPECT_TRUE(reduce_scatters_overlap(plan));
  plan.overlap = false;
  EXPECT_FALSE(reduce_scatters_overlap(plan));
}

// ZeRO-2 along the step (gradient_blocks_above_peak): a bucket's block comes with its first
// gradient, made where the tape copies it in (beside what the kernel made, freed next), and goes
// when its reduce-scatter starts, from the accumulation that completes it. Overlapped, a block stays
// until the next bucket's starts, and each start from the second micro-batch on makes a part of
// the shard's size that stays as long.
TEST(ShardTerms, GradientShardsBlocksArePlacedAlongTheStep) {
  ModelProfile profile = adamw_profile();
  profile.block_buckets = {{1000}, {1000}};
  const StepTrace trace = two_block_step(1024);
  const int64_t bucket = arena_bytes(4 * 1000), part = 2048;
  // Each block alone, bucket 1's beside the 1024 bytes its kernel made (copied in, then freed).
  EXPECT_EQ(gradient_blocks_above_peak(profile, trace, 4, false), bucket);
  // Bucket 0's block in flight while bucket 1's gradient arrives.
  EXPECT_EQ(gradient_blocks_above_peak(profile, trace, 4, true), 2 * bucket);
  // And bucket 0's part beside them.
  EXPECT_EQ(gradient_blocks_above_peak(profile, trace, 4, true, {part, part}), 2 * bucket + part);
  profile.block_buckets.clear();
  EXPECT_EQ(gradient_blocks_above_peak(profile, trace, 4, true), -1) << "no block buckets: the caller's resident term";
}

// Blocks larger than parallel.bucket_mb hold several buckets: what forward ends with is the last
// block's buckets, found by the block's index, not by a bucket's (GPT-2's 154 MB embedding in
// 25 MB buckets crashed the planner, or put it 154 MB low, when it mixed the two).
TEST(ShardTerms, ABlockOfSeveralBucketsIsHeldWhole) {
  ModelProfile profile = adamw_profile();
  profile.block_buckets = {{100}, {200}, {300}, {400}, {500}};
  profile.block_bucket_uses = {{0, 1}, {2, 3, 4}};
  const int64_t last = arena_bytes(4 * 300) + arena_bytes(4 * 400) + arena_bytes(4 * 500);
  EXPECT_EQ(gathered_parameter_bytes(profile, 4, nullptr, 0), last);
  EXPECT_EQ(gathered_parameter_bytes(profile, 4, nullptr, 1), last + arena_bytes(4 * 100) + arena_bytes(4 * 200));
  StepTrace trace;
  trace.tensors = {TraceTensor{1000, -1, false}};
  TraceKernel loss;  // outside the blocks: what forward ended with is gathered
  trace.kernels = {loss};
  using K = TraceEvent::Kind;
  trace.events = {{K::kKernelBegins, 0}, {K::kAllocated, 0}, {K::kKernelEnds, 0}};
  EXPECT_EQ(gathered_parameter_peak_bytes(profile, trace, 4, nullptr, 0), last);
}

// ZeRO-3's all-gathers each micro-batch: forward gathers each block's buckets (the tied one again
// at the last block, as forward freed it after block 0); backward starts from what the last block
// left gathered and gathers block 1's (block 0 reads only the tied bucket, still gathered). With
// prefetch, a gather runs while the block before it computes: with blocks of a second each, all
// but forward's first; on GPUs only, where the gathers have an engine of their own: CPU ranks
// gather with the cores that compute.
TEST(ShardTerms, ParameterGathersAreWhatEachPassGathersAndPrefetchHidesTheRest) {
  ModelProfile profile = adamw_profile();
  profile.block_buckets = {{10, 100}, {4000}, {500}};
  profile.block_bucket_uses = {{2}, {1}, {0, 2}};
  profile.buckets = {{10, 100, 4000, 500}};
  profile.parameters = 4610;
  profile.gradient_bytes = arena_bytes(4 * 4610);
  Machine m;
  m.devices_per_node = 8;
  m.intra_node_gbps = 10;
  m.intra_node_latency_us = 0;
  m.shared_host = false;  // GPUs
  auto ag = [&](int64_t elements) { return allgather_ms(m, 2, arena_bytes(4 * elements)); };
  const double pass = ag(500) + ag(4000) + ag(110) + ag(500) + ag(4000);
  Plan plan;
  plan.ranks = 2;
  plan.shard = ShardLevel::kParameters;
  plan.accumulation = 3;
  plan.prefetch = 0;
  Prediction t;
  t.compute_ms = 3 * 3000;  // 1 s a block a micro-batch (no block times: even shares)
  shard_time_terms(profile, m, plan, t);
  EXPECT_NEAR(t.gather_ms, 3 * pass, 1e-12) << "without prefetch every gather is waited for";
  EXPECT_EQ(t.gather_hidden_ms, 0.0);
  plan.prefetch = 1;
  Prediction ahead;
  ahead.compute_ms = t.compute_ms;
  shard_time_terms(profile, m, plan, ahead);
  EXPECT_NEAR(ahead.gather_ms, 3 * ag(500), 1e-12) << "only forward's first block waits";
  EXPECT_NEAR(ahead.gather_hidden_ms, 3 * (pass - ag(500)), 1e-12);
  Machine cpu = m;
  cpu.shared_host = true;
  Prediction on_cpu;
  on_cpu.compute_ms = t.compute_ms;
  shard_time_terms(profile, cpu, plan, on_cpu);
  EXPECT_NEAR(on_cpu.gather_ms, 3 * pass, 1e-12) << "CPU ranks: prefetching hides nothing";
  EXPECT_EQ(on_cpu.gather_hidden_ms, 0.0);
}

// At "parameters" without eviction the search weighs gathering where read against prefetching a
// block ahead; under a budget with eviction the memory manager decides, and it offers one plan.
TEST(ShardTerms, TheSearchOffersPrefetchWhereNothingEvicts) {
  SearchOptions options;
  options.ranks = {2};
  options.stages = {1};
  options.precisions = {MixedPrecision::kOff};
  options.policies = {MemoryPolicy::kNone, MemoryPolicy::kDtr};
  options.shards = {ShardLevel::kGradients, ShardLevel::kParameters};
  options.max_accumulation = 1;
  std::vector<std::pair<MemoryPolicy, int>> parameters;
  int gradients = 0;
  for (const Plan& p : candidate_plans(8, 1 << 30, options)) {
    if (p.shard == ShardLevel::kParameters) parameters.emplace_back(p.policy, prefetch_depth(p));
    if (p.shard == ShardLevel::kGradients) ++gradients;
  }
  EXPECT_EQ(gradients, 2);
  EXPECT_THAT(parameters, ::testing::UnorderedElementsAre(std::pair{MemoryPolicy::kNone, 0}, std::pair{MemoryPolicy::kNone, 1},
                                                          std::pair{MemoryPolicy::kDtr, 0}));
}

TEST(ShardTerms, TheSearchOffersLevelsToSeveralReplicas) {
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
    EXPECT_EQ(p.stages, 1) << "one micro-batch: no pipeline";
  }
  EXPECT_EQ(sharded, 2) << "2 and 4 replicas";
}

}  // namespace
}  // namespace ht

namespace ht {
namespace {

// A step of `blocks` blocks, forward then backward, with tensors allocated and freed inside and
// between kernels (a fixed pseudo-random draw), each backward kernel giving its block's bucket.
StepTrace drawn_step(int blocks, uint32_t seed) {
  using K = TraceEvent::Kind;
  StepTrace trace;
  auto draw = [&seed] { return seed = seed * 1664525u + 1013904223u; };
  std::vector<int> alive;
  auto tensor_events = [&](int n) {
    for (int j = 0; j < n; ++j) {
      if (!alive.empty() && draw() % 3 == 0) {
        const size_t at = draw() % alive.size();
        trace.events.push_back({K::kFreed, alive[at]});
        alive.erase(alive.begin() + static_cast<std::ptrdiff_t>(at));
      } else {
        trace.tensors.push_back({static_cast<int64_t>(64 * (1 + draw() % 100))});
        alive.push_back(static_cast<int>(trace.tensors.size()) - 1);
        trace.events.push_back({K::kAllocated, alive.back()});
      }
    }
  };
  for (int pass = 0; pass < 2; ++pass) {
    for (int b = 0; b < blocks; ++b) {
      TraceKernel k;
      k.block = pass == 0 ? b : blocks - 1 - b;
      k.backward = pass == 1;
      if (k.backward) k.gradient_buckets = {b};  // reduction order: the last block's bucket first
      trace.kernels.push_back(k);
      const int index = static_cast<int>(trace.kernels.size()) - 1;
      tensor_events(static_cast<int>(draw() % 3));
      trace.events.push_back({K::kKernelBegins, index});
      tensor_events(static_cast<int>(1 + draw() % 5));
      trace.events.push_back({K::kKernelEnds, index});
    }
  }
  tensor_events(4);
  return trace;
}

// The walk event by event, as it was written before the fold (gathered_parameter_peak_bytes').
int64_t walked_event_by_event(const ModelProfile& profile, const StepTrace& trace, bool overlapped,
                              const std::vector<int64_t>& parts, const std::function<int64_t(const TraceKernel&)>& held_at) {
  GradientBlockSteps steps = gradient_block_steps(profile, trace, 4, overlapped, parts);
  int64_t in_use = 0, peak = 0, top = 0, held = 0, blocks = 0;
  for (size_t i = 0; i <= steps.end; ++i) {
    blocks += steps.made.take(i);
    top = std::max(top, in_use + held + blocks);
    if (i == steps.end) {
      in_use -= trailing_frees(trace, steps.end);
    } else if (const TraceEvent& e = trace.events[i]; e.kind == TraceEvent::Kind::kKernelBegins) {
      held = held_at(trace.kernels[static_cast<size_t>(e.index)]);
    } else if (e.kind == TraceEvent::Kind::kAllocated) {
      in_use += trace.tensors[static_cast<size_t>(e.index)].bytes;
    } else if (e.kind == TraceEvent::Kind::kFreed) {
      in_use -= trace.tensors[static_cast<size_t>(e.index)].bytes;
    }
    peak = std::max(peak, in_use);
    top = std::max(top, in_use + held + blocks);
    blocks += steps.started.take(i);
    top = std::max(top, in_use + held + blocks);
  }
  return top - peak;
}

// The fold (StepFold) visits only the events where a walk's own terms change and takes each gap
// between them whole: every walk along it reads what the walk event by event reads, to the byte.
TEST(ShardTerms, AFoldedStepWalksAsTheStepEventByEvent) {
  for (uint32_t seed : {1u, 7u, 42u, 1234u}) {
    const int blocks = 3 + static_cast<int>(seed % 4);
    ModelProfile profile = adamw_profile();
    for (int b = 0; b < blocks; ++b) profile.block_buckets.push_back({500 + 100 * b});
    const StepTrace trace = drawn_step(blocks, seed);
    const StepFold fold = fold_step(profile, trace);
    EXPECT_LT(fold.at.size(), trace.events.size()) << "seed " << seed;
    auto by_block = [&](const TraceKernel& k) { return int64_t{4096} * (k.block + 1) * (k.backward ? 2 : 1); };
    for (bool overlapped : {false, true}) {
      for (const std::vector<int64_t>& parts : {std::vector<int64_t>{}, std::vector<int64_t>(static_cast<size_t>(blocks), 1024)}) {
        GradientBlockSteps steps = gradient_block_steps(profile, fold, 4, overlapped, parts);
        const int64_t walked = walk_above_peak(trace, fold, steps, by_block);
        EXPECT_GT(walked, 0) << "a block's gathered bytes are beside every kernel";
        EXPECT_EQ(walked,
                  walked_event_by_event(profile, trace, overlapped, parts, by_block))
            << "seed " << seed << ", overlapped " << overlapped << ", parts " << parts.size();
        EXPECT_EQ(gradient_blocks_above_peak(profile, trace, fold, 4, overlapped, parts),
                  walked_event_by_event(profile, trace, overlapped, parts, [](const TraceKernel&) { return int64_t{0}; }))
            << "seed " << seed << ", overlapped " << overlapped << ", parts " << parts.size();
      }
    }
  }
}

}  // namespace
}  // namespace ht

namespace ht {
namespace {

// training.gradient_dtype = "bf16" (planner/gradient_blocks.h): the profile is traced with fp32
// gradients; a bf16 plan's gradient block, its shards and its reduce-scatters are the same
// elements at 2 bytes. ZeRO's paper's 16-bit count at stage 2: 2/N of gradients where fp32 is 4/N.
TEST(ShardTerms, Bf16GradientsAreTwoBytesAnElementInTheBlockTheShardsAndTheWire) {
  const ModelProfile profile = adamw_profile();
  Plan plan;
  plan.ranks = 4;
  plan.precision = MixedPrecision::kBf16;
  plan.shard = ShardLevel::kGradients;
  EXPECT_EQ(gradient_element_bytes(profile, plan), 4) << "auto: fp32";
  EXPECT_EQ(gradient_block_bytes(profile, plan), profile.gradient_bytes);
  Plan narrow = plan;
  narrow.gradient_dtype = GradientDtype::kBf16;
  EXPECT_EQ(gradient_element_bytes(profile, narrow), 2);
  EXPECT_EQ(gradient_block_bytes(profile, narrow), arena_bytes(2 * 6610));
  Plan off = narrow;
  off.precision = MixedPrecision::kFp16;
  EXPECT_EQ(gradient_element_bytes(profile, off), 4) << "bf16 gradients only under bf16 precision";

  Prediction wide = whole(profile, 100000), half = whole(profile, 100000);
  shard_memory_terms(profile, plan, wide);
  shard_memory_terms(profile, narrow, half);
  // Rank 0's shards (1003 + 650 elements, one tensor a bucket), and the largest bucket's block in
  // flight beside the activations (no step to walk here): each at 2 bytes for 4.
  EXPECT_EQ(wide.gradient_bytes, arena_bytes(4 * 1003) + arena_bytes(4 * 650) + arena_bytes(4 * 4010));
  EXPECT_EQ(half.gradient_bytes, arena_bytes(2 * 1003) + arena_bytes(2 * 650) + arena_bytes(2 * 4010));
  EXPECT_EQ(wide.peak_bytes - half.peak_bytes, wide.gradient_bytes - half.gradient_bytes);

  Machine m;
  m.devices_per_node = 8;
  m.intra_node_gbps = 10;
  m.intra_node_latency_us = 0;
  Prediction wide_time, half_time;
  shard_time_terms(profile, m, plan, wide_time);
  shard_time_terms(profile, m, narrow, half_time);
  EXPECT_GT(half_time.allreduce_ms, 0.0);
  EXPECT_NEAR(half_time.allreduce_ms, wide_time.allreduce_ms / 2, 1e-12) << "half the bytes reduce-scattered";
  EXPECT_DOUBLE_EQ(half_time.gather_ms, wide_time.gather_ms) << "the updated fp32 parameters are gathered as before";
}

// The search asks for bf16 gradients only where fp32 ones do not fit (auto) and a step is one
// micro-batch, and never where the config chose a type.
TEST(ShardTerms, TheSearchTakesBf16GradientsOnlyWhereFp32OnesDoNotFit) {
  Plan roomy;
  roomy.precision = MixedPrecision::kBf16;
  roomy.micro_batch = 4;
  Plan tight = roomy;
  tight.micro_batch = 8;
  // Fits with fp32 gradients at micro-batch 4; at 8 only with bf16 ones; faster with fp32 ones.
  auto predict = [](const Plan& p) {
    Prediction r;
    r.step_ms = bf16_gradients(p) ? 9 : 10;
    r.fits = p.micro_batch == 4 || bf16_gradients(p);
    return r;
  };
  const std::vector<RankedPlan> ranked = rank_plans({roomy, tight}, predict, Objective::kTime, 1);
  ASSERT_EQ(ranked.size(), 2u);
  for (const RankedPlan& r : ranked) {
    EXPECT_TRUE(r.prediction.fits);
    EXPECT_EQ(bf16_gradients(r.plan), r.plan.micro_batch == 8) << describe_plan(r.plan);
  }
  EXPECT_THAT(describe_plan(ranked[0].plan), ::testing::HasSubstr("bf16 with bf16 gradients"));
  Plan fixed = tight;
  fixed.gradient_dtype = GradientDtype::kFp32;
  EXPECT_FALSE(rank_plans({fixed}, predict, Objective::kTime, 1)[0].prediction.fits) << "fp32 as configured";
  Plan accumulating = tight;
  accumulating.micro_batch = 4;
  accumulating.accumulation = 2;
  auto at_eight = [&](const Plan& p) { return predict([&] { Plan q = p; q.micro_batch = 8; return q; }()); };
  EXPECT_FALSE(rank_plans({accumulating}, at_eight, Objective::kTime, 1)[0].prediction.fits)
      << "no bf16 running sum over micro-batches chosen for the user";
}

}  // namespace
}  // namespace ht

// The cost model's terms on a hand-made profile: affine interpolation between measured sizes,
// threads by Amdahl's law, ranks sharing a host, the all-reduce's alpha-beta, and memory as the
// sum of its parts.
#include "planner/cost_model.h"
#include "planner/pipeline_terms.h"
#include "planner/search.h"
#include "planner/shard_terms.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>

namespace ht::test {
namespace {

ModelProfile two_points() {
  ModelProfile p;
  p.parameter_bytes = 1000 * 64;
  p.gradient_bytes = 1000 * 64;
  p.optimizer_state_bytes = 1000 * 64;
  p.input_sample_bytes = 100;
  p.target_sample_bytes = 8;
  p.train_samples = 1000;
  p.global_batch = 64;
  p.steps_per_epoch = 15;
  p.threads = 4;
  for (int64_t m : {8, 32}) {
    ProfilePoint pt;
    pt.micro_batch = m;
    pt.threads = 4;
    pt.forward_backward_ms = 2.0 + 0.5 * static_cast<double>(m);  // affine, not proportional
    pt.optimizer_ms = 1.0;
    pt.step_ms = pt.forward_backward_ms + pt.optimizer_ms;
    pt.persistent_bytes = 3000 * 64;
    pt.batch_bytes = batch_bytes(p, m);
    pt.peak_bytes = pt.persistent_bytes + pt.batch_bytes + 5000 + 1000 * m;
    pt.forward_backward_peak_bytes = pt.peak_bytes;
    p.points.push_back(pt);
  }
  ProfilePoint one = p.points[0];
  one.threads = 1;
  one.forward_backward_ms = 1.0 + 4 * 5.0;  // serial 1 ms, parallel 20 ms over 4 threads = 5 ms
  p.points[0].forward_backward_ms = 1.0 + 5.0;
  p.points.push_back(one);
  return p;
}

TEST(CostModel, AffineInTheMicroBatchBetweenAndBeyondTheMeasuredSizes) {
  ModelProfile p = two_points();
  p.points[0].forward_backward_ms = 6.0;  // 2 + 0.5 x 8
  EXPECT_DOUBLE_EQ(forward_backward_ms(p, 16, MixedPrecision::kOff, 4), 10.0);
  EXPECT_DOUBLE_EQ(forward_backward_ms(p, 64, MixedPrecision::kOff, 4), 34.0);
  EXPECT_EQ(activation_bytes(p, 16, MixedPrecision::kOff), 5000 + 16000);
  EXPECT_EQ(activation_bytes(p, 128, MixedPrecision::kOff), 5000 + 128000);
  EXPECT_THROW(forward_backward_ms(p, 16, MixedPrecision::kBf16, 4), std::invalid_argument);
  // Below the smallest size, never less than its share of the smallest measured step.
  p.points[1].forward_backward_ms = 6.0 + 24 * 2.0;  // steep: the line crosses zero at 5
  EXPECT_DOUBLE_EQ(forward_backward_ms(p, 2, MixedPrecision::kOff, 4), 6.0 * 2 / 8);
}

// One forward kernel making an activation and one backward kernel with a temporary, both
// `per_sample` bytes a sample; `trained` adds a block the traced steps do not have (a trained
// step's trace is recorded by the engine, a traced one's on meta tensors: not one structure).
StepTrace one_step(int64_t micro_batch, int64_t per_sample, bool trained) {
  StepTrace t;
  using Kind = TraceEvent::Kind;
  t.kernels.resize(2);
  t.kernels[1].backward = true;
  t.kernels[1].inputs = {0};
  t.tensors.push_back({micro_batch * per_sample, 0, true});
  t.tensors.push_back({micro_batch * per_sample, -1, false});
  t.events = {{Kind::kKernelBegins, 0}, {Kind::kAllocated, 0}, {Kind::kKernelEnds, 0}, {Kind::kKernelBegins, 1},
              {Kind::kAllocated, 1},    {Kind::kFreed, 1},     {Kind::kKernelEnds, 1}, {Kind::kFreed, 0}};
  if (trained) {
    t.tensors.push_back({64, -1, false});
    t.events.push_back({Kind::kAllocated, 2});
    t.events.push_back({Kind::kFreed, 2});
  }
  return t;
}

// Beyond the largest size, where the two nearest points are not one step at two sizes, every
// block is affine through the nearest two that are: the backward temporary grows with the
// micro-batch as the activation does (it once kept the nearer point's size, and a tensor-parallel
// run's attention backward was predicted at half its scores).
TEST(CostModel, ATraceAtAnUnprofiledSizeIsAffineThroughTwoPointsOfOneStep) {
  ModelProfile p = two_points();  // micro-batches 8 and 32
  p.points[0].trace = one_step(8, 1000, false);
  p.points[1].trace = one_step(32, 1000, false);
  ProfilePoint trained = p.points[1];
  trained.micro_batch = 16;
  trained.trace = one_step(16, 1000, true);
  p.points.push_back(trained);
  for (int64_t m : {64, 24, 4}) {
    SCOPED_TRACE(m);
    const StepTrace t = trace_for(p, m, m, MixedPrecision::kOff);
    ASSERT_EQ(t.tensors.size(), 2u);
    EXPECT_EQ(t.tensors[0].bytes, m * 1000);
    EXPECT_EQ(t.tensors[1].bytes, m * 1000);
  }
}

TEST(CostModel, FewerThreadsByAmdahlsLawThroughTheOneThreadPoint) {
  const ModelProfile p = two_points();
  // At micro-batch 8: 6 ms with 4 threads, 21 with 1: serial 1, parallel 20.
  EXPECT_NEAR(forward_backward_ms(p, 8, MixedPrecision::kOff, 2) / forward_backward_ms(p, 8, MixedPrecision::kOff, 4), (1.0 + 10.0) / 6.0, 1e-9);
}

TEST(CostModel, RanksSharingAHostShareItsThreads) {
  Machine m;
  m.host_threads = 4;
  m.shared_host = true;
  EXPECT_EQ(threads_per_rank(m, 1), 4);
  EXPECT_EQ(threads_per_rank(m, 2), 2);
  EXPECT_EQ(threads_per_rank(m, 8), 1);
  EXPECT_DOUBLE_EQ(oversubscription(m, 2), 1.0);
  EXPECT_DOUBLE_EQ(oversubscription(m, 8), 2.0);
  // training.threads is a rank's: two ranks of one thread on four cores take turns with no one
  // (taken for the host's threads, it predicted them at twice the step), four ranks of two do.
  m.rank_threads = 1;
  EXPECT_EQ(threads_per_rank(m, 2), 1);
  EXPECT_DOUBLE_EQ(oversubscription(m, 2), 1.0);
  m.rank_threads = 2;
  EXPECT_EQ(threads_per_rank(m, 1), 2);
  EXPECT_DOUBLE_EQ(oversubscription(m, 2), 1.0);
  EXPECT_DOUBLE_EQ(oversubscription(m, 4), 2.0);
  // More threads than the host's: the profile measured one such rank taking turns already.
  m.rank_threads = 8;
  EXPECT_DOUBLE_EQ(oversubscription(m, 1), 1.0);
  EXPECT_DOUBLE_EQ(oversubscription(m, 2), 2.0);
  m.rank_threads = 0;
  m.shared_host = false;
  EXPECT_EQ(threads_per_rank(m, 8), 4);
  EXPECT_DOUBLE_EQ(oversubscription(m, 8), 1.0);
}

TEST(CostModel, RingAllReduceAlphaBeta) {
  Machine m;
  m.devices_per_node = 2;
  m.intra_node_gbps = 1;  // 1 byte per ns
  m.inter_node_gbps = 0.5;
  m.intra_node_latency_us = 10;
  m.inter_node_latency_us = 20;
  EXPECT_DOUBLE_EQ(allreduce_ms(m, 1, 1 << 20), 0.0);
  // 2 ranks: 2 steps of 10 us + (1 MB / 2) / 1 GB/s.
  EXPECT_NEAR(allreduce_ms(m, 2, 1000000), 2 * (0.01 + 0.5), 1e-9);
  // 4 ranks span two nodes of 2: the network's latency, and the rings leave each node through
  // both its devices' NICs (NCCL's rail-aligned channels), 2 x 0.5 GB/s, at most the node's link.
  EXPECT_NEAR(allreduce_ms(m, 4, 1000000), 6 * (0.02 + 0.25 / 1.0), 1e-9);
  Machine wide = m;
  wide.devices_per_node = 4;
  wide.intra_node_gbps = 10;
  EXPECT_NEAR(allreduce_ms(wide, 8, 1000000), 14 * (0.02 + 0.125 / 2.0), 1e-9) << "4 NICs a node: 2 GB/s";
  // 2 replicas a tensor-parallel group of 2 apart (the grid puts tensor ranks innermost) are on
  // two nodes, one a node: one NIC's share; and so is their sharded gather.
  EXPECT_NEAR(allreduce_ms(m, 2, 1000000, 2), 2 * (0.02 + 0.5 / 0.5), 1e-9);
  EXPECT_NEAR(allgather_ms(m, 2, 1000000, 2), 0.02 + 0.5 / 0.5, 1e-9);
  EXPECT_NEAR(allgather_ms(m, 2, 1000000, 1), 0.01 + 0.5, 1e-9);
}

TEST(CostModel, PeakIsTheSumOfItsParts) {
  const ModelProfile p = two_points();
  Machine m;
  m.host_threads = 4;
  m.device_memory = 1 << 30;
  Plan plan;
  plan.micro_batch = 16;
  plan.accumulation = 4;  // the rank's batch is 64 samples
  const Prediction r = predict(p, m, plan);
  EXPECT_EQ(r.model_bytes + r.gradient_bytes + r.optimizer_state_bytes, 3000 * 64);
  EXPECT_EQ(r.sampler_bytes, arena_bytes(1000 * 8));
  EXPECT_EQ(r.batch_bytes, arena_bytes(64 * 100) + arena_bytes(64 * 8));
  EXPECT_EQ(r.activation_bytes, 5000 + 16000);
  EXPECT_EQ(r.peak_bytes, 3000 * 64 + r.sampler_bytes + r.batch_bytes + r.activation_bytes);
  EXPECT_TRUE(r.fits);
  EXPECT_DOUBLE_EQ(r.compute_ms, 4 * forward_backward_ms(p, 16, MixedPrecision::kOff, 4));
  m.device_memory = r.peak_bytes - 1;
  EXPECT_FALSE(predict(p, m, plan).fits);
}

// A GPU rank's process holds memory its tensors cannot use: the CUDA context, and one NCCL
// communicator's buffers per group the rank is in. A plan fits the device less that, with 3%
// kept for the caching allocator's fragmentation when nothing evicts.
TEST(CostModel, AGpuRankFitsItsDeviceLessTheRuntimeAndItsCommunicators) {
  const ModelProfile p = two_points();
  Machine m;
  m.shared_host = false;
  m.devices_per_node = 8;
  m.runtime_bytes = 4000;
  m.communicator_bytes = 1000;
  EXPECT_EQ(m.reserved_bytes(false, false, false), 4000);
  EXPECT_EQ(m.reserved_bytes(true, true, true), 7000);
  Plan plan;
  plan.micro_batch = 16;
  plan.accumulation = 2;
  plan.ranks = 2;  // in a data-parallel group: the runtime and one communicator
  const int64_t peak = predict(p, m, plan).peak_bytes;
  m.device_memory = static_cast<int64_t>(std::ceil(static_cast<double>(peak) / 0.97)) + 5000;
  EXPECT_TRUE(predict(p, m, plan).fits);
  m.device_memory -= 100;  // within the 3% the allocator keeps
  const Prediction tight = predict(p, m, plan);
  EXPECT_FALSE(tight.fits);
  EXPECT_NE(tight.why_not.find("fragmentation"), std::string::npos) << tight.why_not;
  m.device_memory = peak + 4999;  // the tensors fit the device, not beside the runtime
  const Prediction over = predict(p, m, plan);
  EXPECT_FALSE(over.fits);
  EXPECT_NE(over.why_not.find("less the runtime's"), std::string::npos) << over.why_not;
  plan.ranks = 1;  // no group: the runtime alone
  m.device_memory = static_cast<int64_t>(std::ceil(static_cast<double>(peak) / 0.97)) + 4000;
  EXPECT_TRUE(predict(p, m, plan).fits);
}

// checkpoint.async: the host copy is the writer's parameters and optimizer state (rank 0 of a
// whole checkpoint; a sharded rank's share of them), held beside the step: on CPU ranks, whose
// device memory is the host's, a plan whose peak and copy exceed a rank's host memory does not fit.
TEST(CostModel, AnAsyncCheckpointsHostCopyIsTheWritersShareAndFitsBesideTheStep) {
  const ModelProfile p = two_points();
  Machine m;
  m.host_threads = 4;
  m.devices_per_node = 2;
  Plan plan;
  plan.micro_batch = 16;
  plan.accumulation = 2;
  EXPECT_EQ(predict(p, m, plan).checkpoint_host_bytes, 0) << "without checkpoint.async, none";
  plan.async_checkpoint = true;
  const Prediction whole = predict(p, m, plan);
  EXPECT_EQ(whole.checkpoint_host_bytes, p.parameter_bytes + p.optimizer_state_bytes);
  Plan sharded = plan;
  sharded.ranks = 2;
  sharded.shard = ShardLevel::kOptimizer;
  EXPECT_EQ(predict(p, m, sharded).checkpoint_host_bytes, (p.parameter_bytes + p.optimizer_state_bytes) / 2);
  m.device_is_host = true;
  m.host_memory = whole.peak_bytes + whole.checkpoint_host_bytes;
  EXPECT_TRUE(predict(p, m, plan).fits);
  m.host_memory -= 1;
  const Prediction over = predict(p, m, plan);
  EXPECT_FALSE(over.fits);
  EXPECT_NE(over.why_not.find("async checkpoint's host copy"), std::string::npos) << over.why_not;
  EXPECT_NE(over.why_not.find("checkpoint.async = false"), std::string::npos) << over.why_not;
  m.device_is_host = false;  // a GPU's host: the copy alone
  EXPECT_TRUE(predict(p, m, plan).fits);
}

// Pipeline stages: four equal blocks on two 1F1B stages, each holding half the parameters. The
// step is the schedule's: (m + p - 1) stage-times of a micro-batch, (p - 1) of them idle on each
// stage (the bubble); the first stage holds its half of p micro-batches' activations, and its
// half of the parameters, gradients and optimizer state.
TEST(CostModel, PipelineStagesPayTheBubbleAndHoldTheirShare) {
  ModelProfile p = two_points();
  for (ProfilePoint& pt : p.points) pt.blocks.assign(4, BlockTime{1.0, 2.0});
  p.block_parameter_bytes.assign(4, p.parameter_bytes / 4);
  Machine m;
  m.host_threads = 4;
  m.devices_per_node = 2;
  Plan one;
  one.micro_batch = 8;
  one.accumulation = 4;
  Plan piped = one;
  piped.stages = 2;
  Plan replicas = one;  // two ranks on the host as well: the same threads per rank
  replicas.ranks = 2;
  const Prediction whole = predict(p, m, one), r = predict(p, m, piped);
  const double fb = predict(p, m, replicas).compute_ms / 4;  // one micro-batch through the whole model
  EXPECT_NEAR(r.compute_ms, (4 + 2 - 1) * fb / 2, 1e-9);
  EXPECT_NEAR(r.bubble_ms, (2 - 1) * fb / 2, 1e-9);
  EXPECT_EQ(r.gradient_bytes, whole.gradient_bytes / 2);
  EXPECT_EQ(r.optimizer_state_bytes, whole.optimizer_state_bytes / 2);
  EXPECT_EQ(r.model_bytes, whole.model_bytes / 2);
  EXPECT_EQ(r.activation_bytes, 2 * (whole.activation_bytes / 2));  // 1F1B: p in flight, half the model
  EXPECT_NEAR(r.stage_imbalance, 1.0, 1e-9);
  // GPipe holds all four micro-batches on the first stage.
  piped.schedule = ScheduleKind::kGpipe;
  EXPECT_EQ(predict(p, m, piped).activation_bytes, 4 * (whole.activation_bytes / 2));
  // Interleaved, two chunks per rank (each rank a quarter of the model twice over): the bubble
  // shrinks by the chunks (Narayanan et al. 2021: (p - 1) / v of a micro-batch's stage time).
  piped.schedule = ScheduleKind::kInterleaved1f1b;
  piped.virtual_stages = 2;
  const Prediction chunked = predict(p, m, piped);
  EXPECT_TRUE(chunked.fits) << chunked.why_not;
  EXPECT_NEAR(chunked.bubble_ms, (2 - 1) * fb / 2 / 2, 1e-9);
  EXPECT_NEAR(chunked.compute_ms, 4 * fb / 2 + (2 - 1) * fb / 2 / 2, 1e-9);
  EXPECT_EQ(chunked.gradient_bytes, whole.gradient_bytes / 2) << "two quarters of the blocks";
  piped.virtual_stages = 4;  // 2 x 4 virtual stages, 4 blocks
  EXPECT_FALSE(predict(p, m, piped).fits);
  piped.schedule = ScheduleKind::k1f1b;
  piped.virtual_stages = 1;
  // More stages than blocks: refused, saying why.
  piped.stages = 8;
  piped.accumulation = 8;
  piped.micro_batch = 4;
  const Prediction too_many = predict(p, m, piped);
  EXPECT_FALSE(too_many.fits);
  EXPECT_NE(too_many.why_not.find("more stages than the model's 4 blocks"), std::string::npos) << too_many.why_not;
}

// A micro-batch crosses each stage boundary forward and its gradient back: the bytes are the
// traced tensors made on one side of the cut and read by a forward kernel on the other (a skip
// connection over the cut included), scaled to the micro-batch; the step waits for the part of
// those messages the schedule cannot hide (Prediction::transfer_ms, in the bubble).
TEST(CostModel, PipelineStagesPayForTheirMessages) {
  ModelProfile p = two_points();
  for (ProfilePoint& pt : p.points) {
    pt.blocks.assign(4, BlockTime{1.0, 2.0});
    // Block b's kernel reads block b - 1's output (1000 bytes a sample); block 2 also reads
    // block 0's output (a skip connection: 500 bytes a sample).
    for (int b = 0; b < 4; ++b) {
      TraceKernel k;
      k.block = b;
      if (b > 0) k.inputs.push_back(b - 1);
      if (b == 2) k.inputs.push_back(4);
      pt.trace.kernels.push_back(k);
      TraceTensor t;
      t.producer = b;
      t.bytes = 1000 * pt.micro_batch;
      pt.trace.tensors.push_back(t);
    }
    TraceTensor skip;
    skip.producer = 0;
    skip.bytes = 500 * pt.micro_batch;
    pt.trace.tensors.push_back(skip);
    TraceKernel backward;  // backward kernels read saved values; they send nothing forward
    backward.backward = true;
    backward.block = 3;
    backward.inputs = {0};
    pt.trace.kernels.push_back(backward);
  }
  p.block_parameter_bytes.assign(4, p.parameter_bytes / 4);
  for (ProfilePoint& pt : p.points) pt.cut_bytes = stage_cut_bytes(pt.trace, 4);  // as the profilers store them
  EXPECT_EQ(stage_boundary_bytes(p.points[0], 0, 8), 8 * (1000 + 500));
  EXPECT_EQ(stage_boundary_bytes(p.points[0], 1, 8), 8 * (1000 + 500)) << "block 1's output and the skip";
  EXPECT_EQ(stage_boundary_bytes(p.points[0], 2, 16), 16 * 1000);
  // In one pass, as the profilers store it on each point: the same cuts.
  EXPECT_EQ(stage_cut_bytes(p.points[0].trace, 4), (std::vector<int64_t>{12000, 12000, 8000, 0}));
  const std::vector<int64_t> stored = p.points[0].cut_bytes;
  p.points[0].cut_bytes = {1, 2, 3, 4};  // stored cuts are read, not recomputed
  EXPECT_EQ(stage_boundary_bytes(p.points[0], 2, 16), 6);
  p.points[0].cut_bytes = stored;
  Machine m;
  m.host_threads = 4;
  m.devices_per_node = 2;
  m.intra_node_latency_us = 0;
  Plan piped;
  piped.micro_batch = 8;
  piped.accumulation = 4;
  piped.stages = 2;
  m.intra_node_gbps = 1e12;  // free messages: the schedule alone
  const Prediction free = predict(p, m, piped);
  EXPECT_NEAR(free.transfer_ms, 0, 1e-6);
  m.intra_node_gbps = 0.012;  // 12,000 bytes (the cut after block 1 at 8 samples) take 1 ms
  const Prediction paid = predict(p, m, piped);
  EXPECT_GT(paid.transfer_ms, 0);
  EXPECT_NEAR(paid.compute_ms - free.compute_ms, paid.transfer_ms, 1e-9);
  // At least the first forward's message and the last backward's are waited for; at most all
  // of the four micro-batches' two. The wait is idle time: it is in the bubble.
  EXPECT_GE(paid.transfer_ms, 2.0 - 1e-9);
  EXPECT_LE(paid.transfer_ms, 8.0 + 1e-9);
  EXPECT_NEAR(paid.bubble_ms - free.bubble_ms, paid.transfer_ms, 1e-9);
  // Across nodes, the NIC's rate.
  m.intra_node_gbps = 1e12;
  m.inter_node_gbps = 0.012;
  m.inter_node_latency_us = 0;
  m.devices_per_node = 1;
  EXPECT_NEAR(predict(p, m, piped).transfer_ms, paid.transfer_ms, 1e-9);
  // Where the messages match in posting order on serial streams (NCCL), the ranks' streams are
  // played: a message moves once both ends have posted it and a send holds its rank, so the step
  // waits at least as long as with sends that never block, all of it counted as messages' time.
  m.devices_per_node = 2;  // one node again, as `free` and `paid` were priced
  m.intra_node_gbps = 0.012;
  m.p2p_in_posting_order = true;
  const Prediction serial = predict(p, m, piped);
  EXPECT_GE(serial.transfer_ms, paid.transfer_ms - 1e-9);
  EXPECT_NEAR(serial.compute_ms - free.compute_ms, serial.transfer_ms, 1e-9);
  // ZB-H1 there posts its sends deferred past its weight halves (parallel/serial_streams.h): with
  // free messages it loses nothing to the order; with paid ones, more than by tag.
  Plan zb = piped;
  zb.schedule = ScheduleKind::kZbH1;
  const Prediction zb_serial_paid = predict(p, m, zb);
  m.p2p_in_posting_order = false;
  const Prediction zb_by_tag_paid = predict(p, m, zb);
  EXPECT_GT(zb_serial_paid.compute_ms, zb_by_tag_paid.compute_ms + 1e-6);
  m.intra_node_gbps = 1e12;
  const Prediction zb_by_tag_free = predict(p, m, zb);
  m.p2p_in_posting_order = true;
  EXPECT_NEAR(predict(p, m, zb).compute_ms, zb_by_tag_free.compute_ms, 1e-9);
}

// ZeRO-1 within stages: each stage's replicas split that stage's optimizer state (the stage's
// share of the model's, sharded as the model's buckets are), and gather that stage's parameters
// after the step; its parameters and gradients stay whole.
TEST(CostModel, PipelineStagesShardTheirOptimizerStateOverTheirReplicas) {
  ModelProfile p = two_points();
  for (ProfilePoint& pt : p.points) pt.blocks.assign(4, BlockTime{1.0, 2.0});
  p.block_parameter_bytes.assign(4, p.parameter_bytes / 4);
  p.parameters = p.parameter_bytes / 4;
  p.optimizer_state_bytes = 8 * p.parameters;  // AdamW's two moments
  p.buckets = {{4000, 4000}, {4000, 4000}};
  Machine m;
  m.host_threads = 4;
  m.devices_per_node = 4;
  Plan plain;
  plain.ranks = 2;
  plain.stages = 2;
  plain.micro_batch = 8;
  plain.accumulation = 2;
  Plan sharded = plain;
  sharded.shard = ShardLevel::kOptimizer;
  const Prediction a = predict(p, m, plain), b = predict(p, m, sharded);
  EXPECT_EQ(a.optimizer_state_bytes, p.optimizer_state_bytes / 2) << "the stage's half";
  EXPECT_EQ(b.optimizer_state_bytes, p.optimizer_state_bytes / 4) << "and its replica's half of that";
  EXPECT_EQ(b.model_bytes, a.model_bytes);
  EXPECT_EQ(b.gradient_bytes, a.gradient_bytes);
  EXPECT_LE(b.peak_bytes, a.peak_bytes - p.optimizer_state_bytes / 4);
  EXPECT_EQ(a.gather_ms, 0);
  EXPECT_DOUBLE_EQ(b.gather_ms, allgather_ms(m, 2, p.gradient_bytes / 2)) << "the stage's parameters";
  // The search offers it (and not ZeRO-2 or 3 with stages).
  SearchOptions o;
  o.ranks = {4};
  o.stages = {2};
  o.precisions = {MixedPrecision::kOff};
  o.policies = {MemoryPolicy::kNone};
  o.shards = {ShardLevel::kNone, ShardLevel::kOptimizer, ShardLevel::kGradients, ShardLevel::kParameters};
  std::set<ShardLevel> offered;
  for (const Plan& c : candidate_plans(16, 0, o)) offered.insert(c.shard);
  EXPECT_EQ(offered, (std::set<ShardLevel>{ShardLevel::kNone, ShardLevel::kOptimizer}));
}

// The search offers the interleaved schedule beside 1F1B where asked (a cluster's search asks
// for two chunks a stage), only where the micro-batches allow it (a multiple of the stages).
TEST(CostModel, TheSearchOffersInterleavedStagesWhereTheMicroBatchesAllow) {
  SearchOptions o;
  o.ranks = {2};
  o.stages = {2};
  o.precisions = {MixedPrecision::kOff};
  o.policies = {MemoryPolicy::kNone};
  o.max_accumulation = 8;
  o.virtual_stages = 2;
  int interleaved = 0, plain = 0;
  for (const Plan& c : candidate_plans(6, 0, o)) {
    if (c.stages < 2) continue;
    if (c.schedule == ScheduleKind::kInterleaved1f1b) {
      ++interleaved;
      EXPECT_EQ(c.virtual_stages, 2);
      EXPECT_EQ(c.accumulation % 2, 0) << "micro-batches a multiple of the stages";
    } else {
      ++plain;
    }
  }
  EXPECT_GT(interleaved, 0);
  EXPECT_GT(plain, interleaved) << "6 samples as 3 x 2 has an odd accumulation: 1F1B only";
  o.virtual_stages = 1;
  for (const Plan& c : candidate_plans(6, 0, o)) EXPECT_NE(c.schedule, ScheduleKind::kInterleaved1f1b);
}

// A per-stage plan (pipeline_terms' per_rank): a block costs what its stage's plan makes it cost,
// and the cut is balanced with those costs. Here the first stage's recomputation doubles its
// blocks' time: one block moves to the second stage. The same plan on every rank changes nothing.
TEST(CostModel, PerStagePlansBalanceTheCutWithEachStagesRecomputation) {
  ModelProfile p = two_points();
  for (ProfilePoint& pt : p.points) pt.blocks.assign(4, BlockTime{1.0, 2.0});
  p.block_parameter_bytes.assign(4, p.parameter_bytes / 4);
  Machine m;
  m.host_threads = 4;
  m.devices_per_node = 2;
  Plan piped;
  piped.micro_batch = 8;
  piped.accumulation = 4;
  piped.stages = 2;
  const Prediction base = predict(p, m, piped);
  ASSERT_EQ(base.stage_blocks, (std::vector<int>{2, 2}));
  Prediction q = base;
  q.stage_blocks.clear();
  const double fb = 12.0;
  const int64_t kept = base.activation_bytes;
  const std::vector<StageRecompute> same(2, StageRecompute{fb, kept, 0});
  pipeline_terms(p, m, piped, fb, q, false, &same);
  EXPECT_EQ(q.stage_blocks, (std::vector<int>{2, 2}));
  ASSERT_EQ(q.stage_peak_bytes.size(), 2u);
  const std::vector<StageRecompute> heavy_first{{2 * fb, kept / 2, 100}, {fb, kept, 0}};
  Prediction h = base;
  h.stage_blocks.clear();
  pipeline_terms(p, m, piped, fb, h, false, &heavy_first);
  EXPECT_EQ(h.stage_blocks, (std::vector<int>{1, 3})) << "the recomputing first stage takes one block of four";
  // Stage 0 pays its recomputation; each block of stage 1 half of a stage-0 block.
  EXPECT_NEAR(h.stage_imbalance, 9.0 / 7.5, 1e-9) << "6 and 9 ms: 7.5 the mean";
  EXPECT_LT(h.compute_ms, predict(p, m, piped).compute_ms * 2) << "not every block at the first stage's cost";
}

}  // namespace
}  // namespace ht::test

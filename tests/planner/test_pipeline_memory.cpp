// A pipeline stage's memory from the trace (planner/pipeline_terms.h, block_memory): each block's
// forward leaves tensors for its backward, which a stage holds for every micro-batch in flight;
// its kernels peak above them once; what a stage receives and sends it keeps until that
// micro-batch's backward, and it posts receives ahead. And the cut a
// plan is predicted for is the cut it trains on (Plan::stage_blocks).
#include "planner/cost_model.h"
#include "planner/pipeline_terms.h"
#include "planner/search.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace ht::test {
namespace {

using Kind = TraceEvent::Kind;

// Builds a trace by hand: tensors (bytes, producing kernel) and kernels (block, direction, inputs).
struct TraceBuilder {
  StepTrace t;
  int64_t unit = 1;
  int tensor(int64_t bytes, int producer) {
    t.tensors.push_back(TraceTensor{bytes * unit, producer, false});
    return static_cast<int>(t.tensors.size()) - 1;
  }
  int kernel(int block, bool backward, std::vector<int> inputs) {
    TraceKernel kern;
    kern.block = block;
    kern.backward = backward;
    kern.inputs = std::move(inputs);
    t.kernels.push_back(kern);
    return static_cast<int>(t.kernels.size()) - 1;
  }
};

// One micro-batch through two blocks and the loss, `k` bytes a unit:
//   forward  block 0: a (300, saved), a temporary (50, freed in the kernel), o (60, not saved)
//            block 1: b (200, saved; reads a and o, then frees o), its output c (30, read by the loss only)
//            loss:    l (10, saved); c freed
//   backward loss: g1 (40); l freed. block 1: g2 (70); g1 and b freed. block 0: g3 (20); g2, a, g3 freed.
StepTrace two_blocks(int64_t k) {
  TraceBuilder build;
  build.unit = k;
  StepTrace& t = build.t;
  auto tensor = [&](int64_t bytes, int producer) { return build.tensor(bytes, producer); };
  auto kernel = [&](int block, bool backward, std::vector<int> inputs) { return build.kernel(block, backward, std::move(inputs)); };
  auto ev = [&](Kind kind, int index) { t.events.push_back({kind, index}); };
  const int batch = tensor(1000, -1);
  ev(Kind::kAllocated, batch);  // before any kernel: the batch, not a block's
  const int a = tensor(300, 0), temp = tensor(50, -1), o = tensor(60, 0), b = tensor(200, 1), c = tensor(30, 1);
  const int l = tensor(10, 2);
  const int g1 = tensor(40, -1), g2 = tensor(70, -1), g3 = tensor(20, -1);
  const int k0 = kernel(0, false, {}), k1 = kernel(1, false, {a, o}), k2 = kernel(-1, false, {c});
  const int k3 = kernel(-1, true, {l}), k4 = kernel(1, true, {b}), k5 = kernel(0, true, {a});
  for (auto [kind, index] : std::vector<std::pair<Kind, int>>{
           {Kind::kKernelBegins, k0}, {Kind::kAllocated, a}, {Kind::kAllocated, temp}, {Kind::kFreed, temp}, {Kind::kAllocated, o},
           {Kind::kKernelEnds, k0}, {Kind::kKernelBegins, k1}, {Kind::kAllocated, b}, {Kind::kAllocated, c},
           {Kind::kFreed, o}, {Kind::kKernelEnds, k1},
           {Kind::kKernelBegins, k2}, {Kind::kAllocated, l}, {Kind::kFreed, c}, {Kind::kKernelEnds, k2},
           {Kind::kKernelBegins, k3}, {Kind::kAllocated, g1}, {Kind::kFreed, l}, {Kind::kKernelEnds, k3},
           {Kind::kKernelBegins, k4}, {Kind::kAllocated, g2}, {Kind::kFreed, g1}, {Kind::kFreed, b}, {Kind::kKernelEnds, k4},
           {Kind::kKernelBegins, k5}, {Kind::kAllocated, g3}, {Kind::kFreed, g2}, {Kind::kFreed, a}, {Kind::kFreed, g3},
           {Kind::kKernelEnds, k5}}) {
    ev(kind, index);
  }
  return t;
}

TEST(PipelineMemory, BlocksHoldWhatBackwardReadsAndNeedTheirWorkingSetOnce) {
  const BlockMemory m = block_memory(two_blocks(1), 2);
  EXPECT_EQ(m.held, (std::vector<int64_t>{300, 200 + 10})) << "the loss's saved tensor with the last block";
  // Per block: alone, with its left neighbour's transient tensors, with its right's, with both.
  // Block 0: a and o (360) forward; backward a and its gradient (320), and the one it reads (70),
  // block 1's. Block 1: b and its output c (230; with o, block 0's, 290) forward; backward b, its
  // gradient and the one it reads (310), both its own (the loss's count with it).
  EXPECT_EQ(m.peak, (std::vector<int64_t>{360, 360, 390, 390, 310, 290 + 20, 310, 310}));
  // Backward's kernels alone: block 0's g3 beside a (and g2 with its right neighbour); block 1's
  // as above.
  EXPECT_EQ(m.peak_backward, (std::vector<int64_t>{320, 320, 390, 390, 310, 310, 310, 310}));
  // The cut after block 0: a (held) and o (not): a stage ending there keeps o as its output.
  EXPECT_EQ(m.sent_unheld, (std::vector<int64_t>{60, 0}));
  EXPECT_EQ(m.sent_held, (std::vector<int64_t>{300, 0}));
  EXPECT_EQ(stage_cut_bytes(two_blocks(1), 2), (std::vector<int64_t>{360, 0}));
  EXPECT_TRUE(block_memory(StepTrace{}, 2).held.empty());
}

// Block 0 makes x (100), which block 1's forward reads and keeps, and block 1's backward frees
// before block 0's runs: one rank's block 0 backward sees its temporary t (40) without x, a stage
// ending at block 0 keeps x (its output) until the micro-batch's backward ends.
StepTrace output_freed_by_the_next_block() {
  TraceBuilder build;
  StepTrace& t = build.t;
  auto tensor = [&](int64_t bytes, int producer) { return build.tensor(bytes, producer); };
  auto kernel = [&](int block, bool backward, std::vector<int> inputs) { return build.kernel(block, backward, std::move(inputs)); };
  const int x = tensor(100, 0), y = tensor(50, 1), l = tensor(10, 2), g1 = tensor(20, -1), gx = tensor(30, -1),
            temp = tensor(40, -1);
  const int k0 = kernel(0, false, {}), k1 = kernel(1, false, {x}), k2 = kernel(-1, false, {y});
  const int k3 = kernel(-1, true, {l}), k4 = kernel(1, true, {y, x}), k5 = kernel(0, true, {gx});
  for (auto [kind, index] : std::vector<std::pair<Kind, int>>{
           {Kind::kKernelBegins, k0}, {Kind::kAllocated, x}, {Kind::kKernelEnds, k0},
           {Kind::kKernelBegins, k1}, {Kind::kAllocated, y}, {Kind::kKernelEnds, k1},
           {Kind::kKernelBegins, k2}, {Kind::kAllocated, l}, {Kind::kKernelEnds, k2},
           {Kind::kKernelBegins, k3}, {Kind::kAllocated, g1}, {Kind::kFreed, l}, {Kind::kKernelEnds, k3},
           {Kind::kKernelBegins, k4}, {Kind::kAllocated, gx}, {Kind::kFreed, g1}, {Kind::kFreed, y}, {Kind::kFreed, x},
           {Kind::kKernelEnds, k4},
           {Kind::kKernelBegins, k5}, {Kind::kAllocated, temp}, {Kind::kFreed, gx}, {Kind::kFreed, temp},
           {Kind::kKernelEnds, k5}}) {
    t.events.push_back({kind, index});
  }
  return t;
}

TEST(PipelineMemory, AStageKeepsItsOutputThroughItsBackward) {
  const BlockMemory m = block_memory(output_freed_by_the_next_block(), 2);
  EXPECT_EQ(m.held, (std::vector<int64_t>{100, 60}));
  EXPECT_EQ(m.sent_held, (std::vector<int64_t>{100, 0}));
  // Block 0 without a right neighbour (its stage ends there): t beside x kept, 140; with block 1
  // in its stage, as on one rank: x in forward (100), t beside block 1's gradient in backward (70).
  EXPECT_EQ(std::vector<int64_t>(m.peak.begin(), m.peak.begin() + 4), (std::vector<int64_t>{140, 140, 100, 100}));
  EXPECT_EQ(std::vector<int64_t>(m.peak_backward.begin(), m.peak_backward.begin() + 4),
            (std::vector<int64_t>{140, 140, 70, 70}));
}

ModelProfile piped_profile() {
  ModelProfile p;
  p.parameter_bytes = p.gradient_bytes = p.optimizer_state_bytes = 64 * 1000;
  p.block_parameter_bytes = {32 * 1000, 32 * 1000};
  p.input_sample_bytes = 100;
  p.target_sample_bytes = 8;
  p.train_samples = 1000;
  p.global_batch = 32;
  for (int64_t micro : {8, 32}) {
    ProfilePoint pt;
    pt.micro_batch = micro;
    pt.forward_backward_ms = static_cast<double>(micro);
    pt.step_ms = pt.forward_backward_ms + 1;
    pt.optimizer_ms = 1;
    pt.blocks.assign(2, BlockTime{1.0, 2.0});
    pt.trace = two_blocks(micro / 8);
    pt.persistent_bytes = 3 * 64 * 1000;
    pt.batch_bytes = batch_bytes(p, micro);
    pt.forward_backward_peak_bytes = pt.persistent_bytes + pt.batch_bytes + 400 * micro / 8;
    pt.peak_bytes = pt.forward_backward_peak_bytes;
    set_stage_terms(pt);
    p.points.push_back(pt);
  }
  return p;
}

Machine two_devices() {
  Machine m;
  m.devices_per_node = 2;
  return m;
}

// Micro-batches of 8, four a step, on two 1F1B stages.
Plan two_stages() {
  Plan plan;
  plan.micro_batch = 8;
  plan.accumulation = 4;
  plan.stages = 2;
  return plan;
}

TEST(PipelineMemory, AStageHoldsItsBlocksPerMicroBatchInFlightAndWhatItReceives) {
  const ModelProfile p = piped_profile();
  const Machine m = two_devices();
  Plan plan = two_stages();  // 1F1B: stage 0 holds 2 micro-batches, stage 1 one
  const Prediction r = predict(p, m, plan);
  ASSERT_TRUE(r.fits) << r.why_not;
  EXPECT_EQ(r.stage_blocks, (std::vector<int>{1, 1}));
  // Stage 0 (F0 F1 B0 F2 B1 F3 B2 B3): 2 x (300 held + 60 sent) + 60 above its held at its peak +
  // in a backward, the gradient it computes from and the next backward's posted (2 x 360) = 1500,
  // the fullest. Stage 1: 210 held + 360 received + 100 above its held + in a backward, the next
  // forward's activation posted (360) and the last input gradient it sent (360) = 1390.
  EXPECT_EQ(r.activation_bytes, 1500);
  // At four times the micro-batch, the point traced there, and one micro-batch (one in flight on
  // each stage, nothing posted ahead): stage 0 4 x (360 + 60 + 360) = 3120; stage 1 4 x (210 +
  // 360 + 100 + 360) = 4120, the fullest.
  plan.micro_batch = 32;
  plan.accumulation = 1;
  EXPECT_EQ(predict(p, m, plan).activation_bytes, 4 * 1030);
}

// GPT's head reads the embedding's weight: the last stage trains a copy of it (its gradients
// summed with the first stage's), with a gradient and optimizer state of its own.
TEST(PipelineMemory, AStageTrainsACopyOfTheTiedWeightsItReads) {
  ModelProfile p = piped_profile();
  p.block_tied_reads = {{}, {ModelProfile::TiedRead{0, 0, 1000}}};
  const Prediction r = predict(p, two_devices(), two_stages());
  ASSERT_TRUE(r.fits) << r.why_not;
  // Stage 1: its block's 32,000 bytes and the copy's 1,000, each with a gradient and optimizer
  // state (the profile's: as many bytes again); now the fullest (state and activations 67,390
  // against stage 0's 65,500), its activations as above.
  EXPECT_EQ(r.model_bytes, 33000);
  EXPECT_EQ(r.gradient_bytes, 33000);
  EXPECT_EQ(r.optimizer_state_bytes, 33000);
  EXPECT_EQ(r.activation_bytes, 1390);
}

// two_blocks with block 0's weight cast to 16 bits first (a cast that reads no traced tensor:
// `bytes`, whatever the micro-batch), which block 0's backward reads and frees.
StepTrace with_weight_cast(StepTrace t, int64_t bytes) {
  TraceKernel cast;
  cast.op = "cast";
  cast.block = 0;
  t.kernels.push_back(cast);
  const int k = static_cast<int>(t.kernels.size()) - 1;
  t.tensors.push_back(TraceTensor{bytes, k, false});
  const int w = static_cast<int>(t.tensors.size()) - 1;
  t.kernels[5].inputs.push_back(w);  // block 0's backward
  const auto first = std::find_if(t.events.begin(), t.events.end(),
                                  [](const TraceEvent& e) { return e.kind == Kind::kKernelBegins; });
  t.events.insert(first, {{Kind::kKernelBegins, k}, {Kind::kAllocated, w}, {Kind::kKernelEnds, k}});
  t.events.insert(t.events.end() - 1, TraceEvent{Kind::kFreed, w});
  return t;
}

TEST(PipelineMemory, KeptWeightCopiesAreHeldOnceAStageNotPerMicroBatchInFlight) {
  const BlockMemory m = block_memory(with_weight_cast(two_blocks(1), 100), 2);
  const BlockMemory plain = block_memory(two_blocks(1), 2);
  EXPECT_EQ(m.held, (std::vector<int64_t>{400, 210}));
  EXPECT_EQ(m.weight_casts, (std::vector<int64_t>{100, 0}));
  EXPECT_EQ(m.peak[0], 460) << "the cast, a and o";
  EXPECT_EQ(m.peak_without_casts, plain.peak);
  EXPECT_EQ(m.peak_backward_without_casts, plain.peak_backward);

  ModelProfile p = piped_profile();
  for (ProfilePoint& pt : p.points) {
    pt.precision = MixedPrecision::kBf16;
    pt.trace = with_weight_cast(two_blocks(pt.micro_batch / 8), 100);
    pt.forward_backward_peak_bytes += 100;
    pt.peak_bytes = pt.forward_backward_peak_bytes;
    set_stage_terms(pt);
  }
  Plan plan = two_stages();
  plan.precision = MixedPrecision::kBf16;
  plan.compute_weights = ComputeWeightsMode::kCast;
  const Prediction cast = predict(p, two_devices(), plan);
  ASSERT_TRUE(cast.fits) << cast.why_not;
  // Casting at each read, stage 0 holds the cast for each of its 2 micro-batches in flight: 2 x
  // (400 held + 60 sent) + 60 above its held + 720 posted (as without the cast: 1500) = 1700.
  EXPECT_EQ(cast.activation_bytes, 1700);
  plan.compute_weights = ComputeWeightsMode::kAuto;  // no budget, no ZeRO-3: kept
  const Prediction kept = predict(p, two_devices(), plan);
  ASSERT_TRUE(kept.fits) << kept.why_not;
  // Kept, the stage holds the copy once: 1500 + 100.
  EXPECT_EQ(kept.activation_bytes, 1600);
}

TEST(PipelineMemory, APlanCarriesTheCutItWasPredictedFor) {
  const ModelProfile p = piped_profile();
  const Machine m = two_devices();
  Plan plan = two_stages();
  const std::vector<RankedPlan> ranked =
      rank_plans({plan}, [&](const Plan& x) { return predict(p, m, x); }, Objective::kTime, 1);
  ASSERT_EQ(ranked.size(), 1u);
  EXPECT_EQ(ranked[0].plan.stage_blocks, (std::vector<int>{1, 1})) << "written to plan.toml as parallel.stage_blocks";
  // A cut given is the cut predicted; one the model cannot take is refused, saying why.
  plan.stage_blocks = {2};
  const Prediction bad = predict(p, m, plan);
  EXPECT_FALSE(bad.fits);
  EXPECT_NE(bad.why_not.find("parallel.stage_blocks gives 1 count for 2 stages"), std::string::npos) << bad.why_not;
}

}  // namespace
}  // namespace ht::test

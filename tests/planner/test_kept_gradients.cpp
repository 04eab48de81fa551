// Gradients kept as backward makes them (planner/gradient_blocks.h, kept_gradients_above_peak):
// without a gradient block (no arena, one replica) a kernel's parameter gradients are the tensors
// it made, moved into .grad() and kept to the optimizer's step, where a block would take a copy
// and free them. One micro-batch's forward and backward then peak with the gradients made so far.
#include "planner/gradient_blocks.h"

#include <gtest/gtest.h>

namespace ht::test {
namespace {

using K = TraceEvent::Kind;

// Two blocks forward, each saving 1000 bytes; backward from block 1 (its kernel makes its weight's
// gradient, 300, and its input's, 200) to block 0 (its weight's gradient, 300, and a temporary of
// `temporary` bytes), the tape freeing each kernel's given gradient, then the gradients it copied
// into the block, then what the kernel saved (runtime/tape.cpp).
StepTrace two_block_step(int64_t temporary) {
  StepTrace t;
  t.tensors = {TraceTensor{1000, 0, true}, TraceTensor{1000, 1, true}, TraceTensor{300, 2, false},
               TraceTensor{200, 2, false}, TraceTensor{300, 3, false}, TraceTensor{temporary, 3, false}};
  for (auto [block, backward] : {std::pair{0, false}, {1, false}, {1, true}, {0, true}}) {
    TraceKernel k;
    k.block = block;
    k.backward = backward;
    t.kernels.push_back(k);
  }
  t.kernels[2].gradient_buckets = {0};
  t.kernels[3].gradient_buckets = {1};
  t.events = {{K::kKernelBegins, 0}, {K::kAllocated, 0}, {K::kKernelEnds, 0},
              {K::kKernelBegins, 1}, {K::kAllocated, 1}, {K::kKernelEnds, 1},
              {K::kKernelBegins, 2}, {K::kAllocated, 2}, {K::kAllocated, 3}, {K::kKernelEnds, 2},
              {K::kFreed, 2},        {K::kFreed, 1},
              {K::kKernelBegins, 3}, {K::kAllocated, 4}, {K::kAllocated, 5}, {K::kFreed, 5}, {K::kKernelEnds, 3},
              {K::kFreed, 3},        {K::kFreed, 4},     {K::kFreed, 0}};
  return t;
}

TEST(KeptGradients, AGradientMadeBeforeThePeakStaysBesideIt) {
  // The step peaks as block 1's backward begins (2,500 bytes): no gradient is kept before it.
  EXPECT_EQ(kept_gradients_above_peak(two_block_step(100)), 0);
  // Block 0's temporary makes the peak (1,000 saved + 300 + 2,000 + its input's gradient 200):
  // block 1's weight gradient, freed after its copy on one rank with a block, is still there.
  EXPECT_EQ(kept_gradients_above_peak(two_block_step(2000)), 300);
  EXPECT_EQ(kept_gradients_above_peak(StepTrace{}), -1);
}

TEST(KeptGradients, OnlyARunWithoutABlockAndOneMicroBatchKeepsThem) {
  Plan plan;
  EXPECT_TRUE(keeps_gradients_as_made(plan)) << "one rank, no budget, one micro-batch";
  plan.accumulation = 2;
  EXPECT_FALSE(keeps_gradients_as_made(plan)) << "the second micro-batch's backward has them all";
  plan.accumulation = 1;
  plan.budget_bytes = 1 << 20;
  EXPECT_FALSE(keeps_gradients_as_made(plan)) << "an arena: the gradient block";
  plan.budget_bytes = 0;
  plan.ranks = 2;
  EXPECT_FALSE(keeps_gradients_as_made(plan)) << "replicas: the gradient block data parallelism reduces";
}

}  // namespace
}  // namespace ht::test

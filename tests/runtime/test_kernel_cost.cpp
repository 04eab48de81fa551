// The modelled kernel cost that eviction weighs by default (runtime/kernel_cost.h): multiply-adds
// for contractions and convolutions, bytes moved for the rest, nothing for views; recorded on every
// op call, and the same for the same op on the same shapes however long the kernel took.
#include "runtime/interpreter.h"
#include "runtime/kernel_cost.h"
#include "runtime/ops.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace ht {
namespace {

double bytes_ms(double bytes) { return bytes / kModeledBytesPerMs; }
double flops_ms(double flops) { return flops / kModeledFlopsPerMs; }

TEST(KernelCost, LinearIsItsMultiplyAddsAndTheBytesItMoves) {
  Interpreter interp;
  Tensor x = interp.input(at::ones({4, 8})), w = interp.param(at::ones({16, 8})), b = interp.param(at::ones({16}));
  Tensor y = linear(x, w, b);  // (4, 16): 2 x 64 outputs x 8
  const double moved = 4.0 * (4 * 8 + 16 * 8 + 16 + 4 * 16);
  EXPECT_DOUBLE_EQ(y.info()->modeled_ms(), flops_ms(2.0 * 64 * 8) + bytes_ms(moved));
  Tensor z = matmul(interp.input(at::ones({2, 3, 5})), interp.input(at::ones({2, 5, 7})));  // K = 5
  EXPECT_DOUBLE_EQ(z.info()->modeled_ms(), flops_ms(2.0 * 42 * 5) + bytes_ms(4.0 * (30 + 70 + 42)));
}

TEST(KernelCost, ConvolutionIsOutputsTimesAFiltersSize) {
  Interpreter interp;
  Conv2dArgs args;
  args.padding = {1, 1};
  Tensor x = interp.input(at::ones({2, 3, 8, 8})), w = interp.param(at::ones({4, 3, 3, 3}));
  Tensor y = conv2d(x, w, Tensor(), args);  // (2, 4, 8, 8): 512 outputs, 27 multiply-adds each
  const double moved = 4.0 * (2 * 3 * 64 + 4 * 27 + 512);
  EXPECT_DOUBLE_EQ(y.info()->modeled_ms(), flops_ms(2.0 * 512 * 27) + bytes_ms(moved));
}

TEST(KernelCost, AttentionIsItsTwoContractionsAndHalfOfThemWhenCausal) {
  Interpreter interp;
  // q (2, 4, 16, 8), k and v (2, 2, 16, 8): q k^T and P v, 2 x 4 x 16 x 16 x 8 multiply-adds each.
  Tensor q = interp.input(at::ones({2, 4, 16, 8}));
  Tensor k = interp.input(at::ones({2, 2, 16, 8})), v = interp.input(at::ones({2, 2, 16, 8}));
  const double flops = 4.0 * (2 * 4 * 16 * 16 * 8);
  const double moved = 4.0 * (1024 + 2 * 512 + 1024 + 2 * 4 * 16);  // q, k, v; out and lse
  EXPECT_DOUBLE_EQ(attention(q, k, v, false).info()->modeled_ms(), flops_ms(flops) + bytes_ms(moved));
  EXPECT_DOUBLE_EQ(attention(q, k, v, true).info()->modeled_ms(), flops_ms(flops / 2) + bytes_ms(moved));
}

TEST(KernelCost, ElementwiseMovesBytesAndViewsCostNothing) {
  Interpreter interp;
  Tensor x = interp.input(at::ones({32, 32}));
  Tensor r = relu(x);
  EXPECT_DOUBLE_EQ(r.info()->modeled_ms(), bytes_ms(2 * 4.0 * 1024));
  Tensor v = view(r, {1024});
  EXPECT_EQ(v.info()->modeled_ms(), 0.0);
  EXPECT_EQ(transpose(r, 0, 1).info()->modeled_ms(), 0.0);
}

TEST(KernelCost, TheChunkedLossMovesItsLogitsThreeTimes) {
  // cross_entropy makes and reads its log-probabilities a chunk at a time: three times what it
  // reads (logits (8, 100) fp32, targets (8) int64) and writes (the loss and total weight, fp32).
  Interpreter interp;
  Tensor loss = cross_entropy(interp.input(at::randn({8, 100})), interp.input(at::zeros({8}, at::kLong)));
  EXPECT_DOUBLE_EQ(loss.info()->modeled_ms(), bytes_ms(3 * (4.0 * 800 + 8.0 * 8 + 4.0 + 4.0)));
}

TEST(KernelCost, TheSameCallCostsTheSameWhateverItsTime) {
  Interpreter interp;
  Tensor x = interp.input(at::randn({64, 64}));
  Tensor a = relu(x), b = relu(x);
  a.info()->producer->compute_ms = 5.0;  // one was slowed down by a busy machine
  b.info()->producer->compute_ms = 0.1;
  EXPECT_GT(a.info()->modeled_ms(), 0.0);
  EXPECT_EQ(a.info()->modeled_ms(), b.info()->modeled_ms());
}

}  // namespace
}  // namespace ht

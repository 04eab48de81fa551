// Regeneration: dropped data comes back bit-identical by re-running its producers, from an
// explicit work stack; random ops replay their mask; batch norm never updates running stats twice.
#include "tests/support/op_check.h"
#include "memory/memory_manager.h"

namespace ht::test {
namespace {

TEST(Regeneration, DropByHandAndAskBack) {
  at::manual_seed(0);
  MemoryManager memory;
  Interpreter interp{{}, &memory};
  Tensor x = interp.input(at::randn({8, 16}));
  Tensor w = interp.param(at::randn({32, 16}));
  Tensor y = relu(linear(x, w));
  const at::Tensor before = y.value().clone();
  const int64_t bytes = memory.stats().resident_bytes;
  EXPECT_EQ(bytes, 8 * 32 * 4) << "only y is resident: linear's output was fake-deleted";

  interp.evict(*y.info());
  EXPECT_FALSE(y.info()->resident());
  EXPECT_EQ(memory.stats().resident_bytes, 0);

  EXPECT_TRUE(y.value().equal(before));
  EXPECT_EQ(y.info()->recompute_count, 1u);
  // relu's input (linear's output) was regenerated for the recomputation and dropped after it.
  EXPECT_EQ(memory.stats().resident_bytes, bytes);
  EXPECT_EQ(memory.stats().recomputations, 2);
}

TEST(Regeneration, LongChainUsesNoRecursionAndBoundedMemory) {
  constexpr int kChain = 100000;
  MemoryManager memory;
  Interpreter interp{{}, &memory};
  Tensor x = interp.input(at::zeros({256}));
  Tensor y = x;
  for (int i = 0; i < kChain; ++i) y = add(y, 1.0);  // only the last handle survives
  EXPECT_EQ(memory.stats().resident_tensors, 1);
  interp.evict(*y.info());
  memory.reset_peak();
  EXPECT_EQ(y.value()[0].item<float>(), static_cast<float>(kChain));
  EXPECT_EQ(memory.stats().recomputations, 2 * int64_t{kChain} - 0 - kChain);
  // While regenerating, at most an input and its output are resident at once.
  EXPECT_LE(memory.stats().peak_resident_bytes, 2 * 256 * 4);
  y.reset();
  x.reset();
  EXPECT_EQ(interp.live_records(), 0) << "releasing a long lineage must not recurse";
}

TEST(Regeneration, EveryActivationDroppedStillGivesIdenticalGradients) {
  at::manual_seed(1);
  const at::Tensor x0 = at::randn({4, 3, 8, 8});
  const at::Tensor w0 = at::randn({6, 3, 3, 3});
  const at::Tensor w1 = at::randn({10, 6 * 4 * 4});
  auto run = [&](bool drop_everything) {
    MemoryManager memory;
    Interpreter interp(InterpreterOptions{ExecutionMode::kInterpreted, 5}, &memory);
    at::Tensor w0p = w0.clone().requires_grad_(true), w1p = w1.clone().requires_grad_(true);
    Tensor h = relu(conv2d(interp.input(x0), interp.param(w0p), Tensor(), {{1, 1}, {1, 1}}));
    h = dropout(max_pool2d(h, {2, 2}), 0.3, true);
    Tensor loss = cross_entropy(linear(reshape(h, {4, -1}), interp.param(w1p)),
                                interp.input(at::tensor({1, 2, 3, 4}, at::kLong)));
    h.reset();
    if (drop_everything) {
      EXPECT_GT(memory.evict_all(), 0);
      EXPECT_EQ(memory.stats().resident_bytes, 0);
    }
    interp.backward(loss);
    return std::make_tuple(loss.value().clone(), w0p.grad().clone(), w1p.grad().clone(),
                           memory.stats().recomputations);
  };
  auto [loss_a, g0_a, g1_a, recomputed_a] = run(false);
  auto [loss_b, g0_b, g1_b, recomputed_b] = run(true);
  EXPECT_EQ(recomputed_a, 0);
  EXPECT_GT(recomputed_b, 0);
  EXPECT_TRUE(loss_a.equal(loss_b));
  EXPECT_TRUE(g0_a.equal(g0_b)) << "bit-identical gradients after regeneration";
  EXPECT_TRUE(g1_a.equal(g1_b));
}

TEST(Regeneration, DropoutReplaysItsMask) {
  MemoryManager memory;
  Interpreter interp(InterpreterOptions{ExecutionMode::kInterpreted, 9}, &memory);
  Tensor y = dropout(interp.input(at::randn({1000})), 0.5, true);
  const at::Tensor before = y.value().clone();
  const uint64_t seeds_drawn = interp.seed_counter();
  interp.evict(*y.info());
  EXPECT_TRUE(y.value().equal(before));
  EXPECT_EQ(interp.seed_counter(), seeds_drawn) << "a recomputation must not draw a new seed";
}

TEST(Regeneration, BatchNormRecomputationLeavesRunningStatsAlone) {
  at::manual_seed(2);
  MemoryManager memory;
  Interpreter interp{{}, &memory};
  at::Tensor rm = at::zeros({3}), rv = at::ones({3});
  at::Tensor w = at::ones({3}).requires_grad_(true), b = at::zeros({3}).requires_grad_(true);
  Tensor y = batch_norm(interp.input(at::randn({4, 3, 2, 2})), interp.param(w), interp.param(b),
                        rm, rv, true, 0.1, 1e-5);
  const at::Tensor rm_after = rm.clone(), rv_after = rv.clone(), y_before = y.value().clone();
  memory.evict_all();
  EXPECT_TRUE(y.value().equal(y_before));
  interp.backward({y}, {at::ones_like(y_before)});
  EXPECT_TRUE(rm.equal(rm_after)) << "running mean updated again by a recomputation";
  EXPECT_TRUE(rv.equal(rv_after));
}

TEST(Regeneration, LeavesAndPinnedTensorsAreNotEvictable) {
  MemoryManager memory;
  Interpreter interp{{}, &memory};
  Tensor x = interp.input(at::ones({4}));
  EXPECT_FALSE(x.info()->evictable());
  EXPECT_THROW(interp.evict(*x.info()), c10::Error);
  Tensor y = mul(x, 2.0);
  ++y.info()->pin_count;
  EXPECT_THROW(interp.evict(*y.info()), c10::Error);
  --y.info()->pin_count;
  interp.evict(*y.info());
  EXPECT_EQ(y.value()[0].item<float>(), 2.0f);
}

}  // namespace
}  // namespace ht::test

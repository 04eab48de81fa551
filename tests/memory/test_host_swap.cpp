// Host swap in the interpreter: a saved tensor is copied to host memory, may not be dropped
// while the copy reads it, comes back by a copy and never by a recomputation, is prefetched
// into free memory only, and gives its host bytes back when nobody will read it.
#include "alloc/cpu_arena.h"
#include "memory/memory_manager.h"
#include "alloc/cpu_device_allocator.h"
#include "alloc/host_link.h"
#include "tests/support/op_check.h"

namespace ht::test {
namespace {

struct SwapFixture {
  explicit SwapFixture(double gbps, SwapRule rule = SwapRule::kConvAndMatmul, int64_t host_budget = 64 << 20,
                       bool swapping = true)
      : arena(std::make_shared<CpuArena>(int64_t{64} << 20)), scope(arena) {
    MemoryOptions options = MemoryOptions::budget(arena, EvictionHeuristic::kDtr);
    if (!swapping) {
      memory.configure(options);
      return;
    }
    SwapOptions swap;
    swap.rule = rule;
    swap.link = std::make_shared<ModelledHostLink>(gbps);
    swap.host_budget_bytes = host_budget;
    swap.min_bytes = 0;
    options.swap = swap;
    memory.configure(options);
  }
  std::shared_ptr<CpuArena> arena;
  ArenaScope scope;
  MemoryManager memory;
  Interpreter interp{{}, &memory};
};

TEST(HostSwap, ASavedMatmulOutputComesBackByACopy) {
  at::manual_seed(0);
  SwapFixture f(50);
  Interpreter& interp = f.interp;
  MemoryManager& memory = f.memory;
  memory.begin_step();
  Tensor x = interp.input(at::randn({64, 128}));
  Tensor w = interp.param(at::randn({128, 128}).requires_grad_());
  Tensor h = linear(x, w);  // a matmul's output, saved by gelu's backward
  Tensor g = gelu(h);       // saved by the next matmul as its input
  Tensor z = linear(g, w);
  TensorInfo& saved = *h.info();
  ASSERT_NE(saved.host, nullptr) << "vDNN's rule copies a matmul output that backward reads";
  ASSERT_NE(g.info()->host, nullptr) << "and a matmul's saved input";
  if (saved.copying_to_host()) {
    EXPECT_FALSE(saved.evictable()) << "the copy still reads it";
  }
  saved.host->out->wait();
  EXPECT_TRUE(saved.on_host());
  const at::Tensor before = h.value().clone();
  interp.evict(saved);
  EXPECT_FALSE(saved.resident());
  const int64_t recomputations = memory.stats().recomputations;
  EXPECT_TRUE(h.value().equal(before));
  EXPECT_EQ(memory.stats().recomputations, recomputations) << "a copy back, not a recomputation";
  EXPECT_EQ(saved.recompute_count, 0u);
  EXPECT_EQ(memory.swap_stats()->copies_in, 1);
  memory.end_step();
}

// One forward and backward of a small MLP, everything evictable dropped before backward: the
// weight's gradient, and what host swap did.
struct MlpRun {
  at::Tensor grad;
  SwapStats swap;
  int64_t recomputations = 0;
};

MlpRun mlp_step(bool swapping, SwapRule rule) {
  SwapFixture f(50, rule, 64 << 20, swapping);
  Interpreter& interp = f.interp;
  MemoryManager& memory = f.memory;
  at::manual_seed(1);
  memory.begin_step();
  Tensor x = interp.input(at::randn({64, 128}));
  Tensor w1 = interp.param(at::randn({128, 128}).mul_(0.1).requires_grad_());
  Tensor w2 = interp.param(at::randn({10, 128}).mul_(0.1).requires_grad_());
  Tensor h = x;
  for (int layer = 0; layer < 4; ++layer) h = gelu(linear(h, w1));
  Tensor loss = cross_entropy(linear(h, w2), interp.input(at::randint(10, {64}, at::kLong)));
  h.reset();
  for (TensorInfo* t : std::vector<TensorInfo*>(memory.candidates()))
    if (t->host != nullptr) t->host->out->wait();
  memory.evict_all();
  interp.backward(loss);
  loss.reset();
  memory.end_step();
  MlpRun r;
  {
    HostAllocationScope host;
    r.grad = w1.value().grad().clone();
  }
  if (const SwapStats* s = memory.swap_stats()) r.swap = *s;
  r.recomputations = memory.stats().recomputations;
  return r;
}

TEST(HostSwap, BackwardPrefetchesAndGivesHostMemoryBack) {
  const MlpRun plain = mlp_step(false, SwapRule::kConvAndMatmul);
  EXPECT_GT(plain.recomputations, 0) << "without swap, what was dropped is recomputed";
  for (SwapRule rule : {SwapRule::kConvAndMatmul, SwapRule::kHidden}) {
    const MlpRun swapped = mlp_step(true, rule);
    EXPECT_TRUE(swapped.grad.equal(plain.grad));
    EXPECT_GT(swapped.swap.copies_out, 0);
    EXPECT_GT(swapped.swap.prefetched_in, 0) << "backward starts copies back ahead of use";
    EXPECT_LE(swapped.swap.prefetched_in, swapped.swap.copies_in);
    EXPECT_EQ(swapped.swap.host_bytes, 0) << "host copies go when nobody will read them";
    EXPECT_GT(swapped.swap.peak_host_bytes, 0);
  }
}

// Backward's gradient in flight (waiting for its producer's entry, as a residual block's shortcut
// gradient waits a whole branch) is the last thing memory can come from: with nothing left to
// drop, make_room parks it on host, and it comes back with its bits and strides when taken.
TEST(HostSwap, AGradientInFlightIsParkedOnHostWhenNothingElseCanGo) {
  at::manual_seed(0);
  SwapFixture f(50, SwapRule::kHidden);  // 64 MiB of device memory
  Interpreter& interp = f.interp;
  MemoryManager& memory = f.memory;
  memory.begin_step();
  Tensor x = interp.input(at::randn({1024, 1024}));  // 4 MiB each
  Tensor w = interp.param(at::randn({1024, 1024}).requires_grad_());
  Tensor h = linear(x, w);
  TensorInfo& t = *h.info();
  t.grad = at::empty_strided({1024, 1024}, {1, 1024});  // on the device, in a layout of its own
  t.grad.normal_();
  at::Tensor expected;
  {
    HostAllocationScope host;
    expected = t.grad.clone();
  }
  const std::vector<int64_t> strides(t.grad.strides().begin(), t.grad.strides().end());
  memory.gradient_pending(t);
  // 16 MiB in use: dropping h leaves 52 MiB free, short of this; parking the gradient gives 56.
  at::Tensor big = at::empty({int64_t{54} << 20}, at::TensorOptions().dtype(at::kByte));
  EXPECT_FALSE(t.grad.defined());
  ASSERT_NE(t.parked_grad, nullptr);
  EXPECT_TRUE(t.has_gradient());
  EXPECT_EQ(memory.swap_stats()->gradients_parked, 1);
  big.reset();
  const at::Tensor back = memory.take_gradient(t);
  EXPECT_EQ(t.parked_grad, nullptr);
  EXPECT_TRUE(f.arena->contains(back.data_ptr())) << "back in device memory";
  EXPECT_TRUE(back.equal(expected));
  EXPECT_EQ(std::vector<int64_t>(back.strides().begin(), back.strides().end()), strides);
  EXPECT_EQ(memory.swap_stats()->host_bytes, h.info()->host ? static_cast<int64_t>(h.info()->host->host.nbytes()) : 0)
      << "the parked bytes went back";
  EXPECT_THROW(at::empty({int64_t{60} << 20}, at::TensorOptions().dtype(at::kByte)), OutOfBudget)
      << "a gradient already taken is not parked again";
  memory.end_step();
}

TEST(HostSwap, AFullHostBudgetMakesNoCopy) {
  at::manual_seed(0);
  SwapFixture f(50, SwapRule::kConvAndMatmul, /*host_budget=*/1024);
  Interpreter& interp = f.interp;
  MemoryManager& memory = f.memory;
  memory.begin_step();
  Tensor x = interp.input(at::randn({64, 128}));
  Tensor w = interp.param(at::randn({128, 128}).requires_grad_());
  Tensor g = gelu(linear(x, w));
  EXPECT_EQ(g.info()->host, nullptr);
  EXPECT_GT(memory.swap_stats()->refused_host_full, 0);
  EXPECT_EQ(memory.swap_stats()->host_bytes, 0);
  memory.end_step();
}

}  // namespace
}  // namespace ht::test

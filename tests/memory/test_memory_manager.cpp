// The memory manager under a budget: device memory is an arena of the budget's size, eviction
// keeps work within it, and what cannot fit fails with the numbers a user needs.
#include "alloc/cpu_arena.h"
#include "alloc/cpu_device_allocator.h"
#include "memory/memory_manager.h"
#include "runtime/interpreter.h"
#include "runtime/ops.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <thread>

namespace ht {
namespace {

constexpr int64_t kKiB = 1024;

// An interpreter whose tensors live in an arena of `capacity` bytes, evicting by `heuristic`
// (none: never evict).
struct Budgeted {
  Budgeted(int64_t capacity, std::optional<EvictionHeuristic> heuristic)
      : arena(std::make_shared<CpuArena>(capacity)), scope(arena) {
    memory.configure(MemoryOptions::budget(arena, heuristic));
  }
  std::shared_ptr<CpuArena> arena;
  ArenaScope scope;
  MemoryManager memory;
  Interpreter interp{{}, &memory};
};

// A chain y_i = tanh(y_{i-1}) of `n` tensors of 64 KiB, every handle kept, then the sum of
// all: 64 KiB * n must be live at once without eviction.
at::Tensor chain_sum(Interpreter& interp, int n) {
  Tensor x = interp.input(at::linspace(-1, 1, 16 * kKiB));
  std::vector<Tensor> ys{tanh(x)};
  for (int i = 1; i < n; ++i) ys.push_back(tanh(ys.back()));
  Tensor total = ys[0];
  for (int i = 1; i < n; ++i) total = add(total, ys[i]);
  return total.value().clone();
}

TEST(MemoryManager, EvictsToStayWithinTheBudgetAndComputesTheSameBits) {
  at::Tensor expected;
  {
    MemoryManager plain_memory;
    Interpreter plain{{}, &plain_memory};
    expected = chain_sum(plain, 40);  // 2.5 MiB of activations
  }
  for (EvictionHeuristic h : {EvictionHeuristic::kDtr, EvictionHeuristic::kDtrEq, EvictionHeuristic::kMegEngine,
                              EvictionHeuristic::kLru, EvictionHeuristic::kLargest}) {
    Budgeted b(640 * kKiB, h);  // room for 10 of the 40 tensors
    at::Tensor sum = chain_sum(b.interp, 40);
    EXPECT_TRUE(sum.equal(expected)) << choice_name(h);
    const MemoryStats& s = b.memory.stats();
    EXPECT_GT(s.evictions, 0) << choice_name(h);
    EXPECT_GT(s.recomputations, 0) << choice_name(h);
    EXPECT_LE(b.arena->stats().peak_in_use, 640 * kKiB);
    EXPECT_LE(s.peak_resident_bytes, 640 * kKiB);
    EXPECT_EQ(s.min_budget_bytes, 0) << "memory never ran out for good";
  }
}

TEST(MemoryManager, WithoutEvictionAFullBudgetIsAnError) {
  Budgeted b(640 * kKiB, std::nullopt);
  try {
    chain_sum(b.interp, 40);
    FAIL() << "expected OutOfBudget";
  } catch (const OutOfBudget& e) {
    EXPECT_EQ(e.capacity, 640 * kKiB);
    EXPECT_EQ(e.requested, 64 * kKiB);
    EXPECT_GT(e.in_use + e.requested, e.capacity);
  }
  EXPECT_EQ(b.memory.stats().evictions, 0);
}

TEST(MemoryManager, ImpossibleBudgetReportsTheSmallestThatCouldWork) {
  // One op needs its input (64 KiB, a leaf) and its output (64 KiB) at once: 96 KiB cannot work.
  Budgeted b(96 * kKiB, EvictionHeuristic::kDtr);
  Tensor x = b.interp.input(at::ones({16 * kKiB}));
  EXPECT_THROW(relu(x), OutOfBudget);
  EXPECT_EQ(b.memory.stats().min_budget_bytes, 128 * kKiB);
}

TEST(MemoryManager, BudgetBelowThePinnedSet) {
  // The inputs alone overflow it: the leaf allocation itself fails, before any op.
  Budgeted b(32 * kKiB, EvictionHeuristic::kDtr);
  EXPECT_THROW(b.interp.input(at::ones({16 * kKiB})), OutOfBudget);
}

TEST(MemoryManager, FragmentedMemoryEvictsTheTensorThatJoinsAHole) {
  // [x][a][hole][b][hole][c][filler], 64 KiB each: 128 KiB are free, in two holes. For 160 KiB,
  // only evicting b (hole + b + hole = 192 KiB) makes one block large enough, though lru
  // would pick a.
  Budgeted b(2048 * kKiB, EvictionHeuristic::kLru);
  auto block = [] { return at::empty({16 * kKiB}); };  // 64 KiB
  Tensor x = b.interp.input(block());
  PlacementScope among_activations(Placement::kActivation);  // as a kernel's outputs would be
  Tensor a = relu(x);
  at::Tensor hole1 = block();
  Tensor bb = relu(x);
  at::Tensor hole2 = block();
  Tensor c = relu(x);
  at::Tensor filler = at::empty({b.arena->stats().largest_free_block / 4});
  ASSERT_LT(a.value().data_ptr(), hole1.data_ptr());
  ASSERT_LT(hole1.data_ptr(), bb.value().data_ptr());
  ASSERT_LT(bb.value().data_ptr(), hole2.data_ptr());
  ASSERT_LT(hole2.data_ptr(), c.value().data_ptr());
  hole1.reset();
  hole2.reset();
  bb.info()->last_access = c.info()->last_access = b.interp.now();  // lru alone would evict a
  ASSERT_EQ(b.arena->stats().largest_free_block, 64 * kKiB);
  EXPECT_TRUE(b.memory.make_room(160 * kKiB));
  EXPECT_FALSE(bb.info()->resident());
  EXPECT_TRUE(a.info()->resident());
  EXPECT_TRUE(c.info()->resident());
  EXPECT_EQ(b.memory.stats().evictions, 1);
  EXPECT_EQ(b.arena->stats().largest_free_block, 192 * kKiB);
}

TEST(MemoryManager, ANeedForOneBlockEvictsTheCheapestRunOfNeighbours) {
  // [x][a][b][c][d][filler], 64 KiB each, nothing free between them: 128 KiB in one block needs
  // two neighbours gone. a is the cheapest tensor, b the dearest: one by one (Coop's "before"),
  // DTR evicts a, then b, which joins a's hole; the window evicts c and d, which cost less together.
  for (bool window : {true, false}) {
    SCOPED_TRACE(window ? "window" : "one by one");
    auto arena = std::make_shared<CpuArena>(2048 * kKiB);
    ArenaScope scope(arena);
    MemoryOptions m = MemoryOptions::budget(arena, EvictionHeuristic::kDtr);
    m.eviction->window = window;
    MemoryManager memory;
    Interpreter interp{{}, &memory};
    memory.configure(m);
    Tensor x = interp.input(at::empty({16 * kKiB}));
    PlacementScope among_activations(Placement::kActivation);
    Tensor a = relu(x), b = relu(x), c = relu(x), d = relu(x);
    at::Tensor filler = at::empty({arena->stats().largest_free_block / 4});
    ASSERT_EQ(arena->stats().free_bytes, 0);
    ASSERT_LT(a.value().data_ptr(), d.value().data_ptr());
    const double cost[] = {1, 100, 2, 3};
    int i = 0;
    for (Tensor* t : {&a, &b, &c, &d}) {
      t->info()->producer->compute_ms = t->info()->producer->modeled_ms = cost[i++];
      t->info()->last_access = interp.now();
    }
    EXPECT_TRUE(memory.make_room(128 * kKiB));
    EXPECT_EQ(memory.stats().evictions, 2);
    EXPECT_EQ(memory.stats().window_evictions, window ? 2 : 0);
    EXPECT_EQ(a.info()->resident(), window);
    EXPECT_EQ(b.info()->resident(), window);
    EXPECT_EQ(c.info()->resident(), !window);
    EXPECT_EQ(d.info()->resident(), !window);
    EXPECT_EQ(arena->stats().largest_free_block, 128 * kKiB);
  }
}

TEST(MemoryManager, AKernelRerunsWhenItsBlocksFitInPieces) {
  // [a 256K][free 256K][b 256K][free 256K], a and b not evictable: a kernel that held 256 KiB of
  // its own when a 128 KiB request failed fits again in the two holes, though no one block holds
  // all 384 KiB; one that held 512 KiB does not fit at all.
  Budgeted b(1024 * kKiB, EvictionHeuristic::kDtr);
  std::vector<at::Tensor> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(at::empty({64 * kKiB}));
  ASSERT_EQ(b.arena->stats().free_bytes, 0);
  blocks[1].reset();
  blocks[3].reset();
  ASSERT_EQ(b.arena->stats().largest_free_block, 256 * kKiB);
  auto failure = [&](int64_t held) {
    const ArenaStats s = b.arena->stats();
    return OutOfBudget("test", 128 * kKiB, s.in_use + held, s.capacity, s.largest_free_block);
  };
  EXPECT_TRUE(b.memory.make_room_after(failure(256 * kKiB)));
  EXPECT_FALSE(b.memory.make_room_after(failure(512 * kKiB)));
  EXPECT_EQ(b.memory.stats().evictions, 0);
}

TEST(MemoryManager, OnlyTheInterpreterThreadMayEvict) {
  Budgeted b(1024 * kKiB, EvictionHeuristic::kDtr);
  Tensor x = b.interp.input(at::ones({16 * kKiB}));
  Tensor y = relu(x);
  bool made_room = true;
  std::thread other([&] { made_room = b.memory.make_room(4096 * kKiB); });
  other.join();
  EXPECT_FALSE(made_room);
  EXPECT_TRUE(y.info()->resident());
  EXPECT_EQ(b.memory.stats().evictions, 0);
}

TEST(MemoryManager, RetriesAKernelWhoseWorkerThreadRanOutOfMemory) {
  // A kernel that allocates on another thread, as ATen's parallel kernels may: that thread may
  // not evict, so the allocation fails; run_with_room makes room here and runs it again.
  Budgeted b(256 * kKiB, EvictionHeuristic::kLru);
  Tensor x = b.interp.input(at::ones({16 * kKiB}));
  Tensor y = relu(x);  // 64 KiB, evictable
  Tensor z = relu(x);  // 64 KiB, evictable
  int attempts = 0;
  at::Tensor result = run_with_room(b.memory, [&] {
    ++attempts;
    at::Tensor out;
    std::exception_ptr failure;
    std::thread worker([&] {
      try {
        out = at::empty({24 * kKiB});  // 96 KiB: more than the 64 KiB free
      } catch (...) {
        failure = std::current_exception();
      }
    });
    worker.join();
    if (failure) std::rethrow_exception(failure);
    return out;
  });
  EXPECT_EQ(attempts, 2);
  EXPECT_EQ(result.numel(), 24 * kKiB);
  EXPECT_GE(b.memory.stats().evictions, 1);
}

TEST(MemoryManager, EvictAllDropsEveryEvictableRootAndItsViews) {
  MemoryManager memory;
  Interpreter interp{{}, &memory};
  Tensor x = interp.input(at::ones({4, 8}));
  Tensor y = relu(x);
  Tensor v = transpose(y, 0, 1);
  EXPECT_EQ(memory.evict_all(), 1);
  EXPECT_FALSE(y.info()->resident());
  EXPECT_FALSE(v.info()->resident());
  EXPECT_EQ(memory.stats().resident_bytes, 0);
  EXPECT_TRUE(v.value().equal(at::ones({8, 4})));
}

// One step of mul(x, w) then `n` tanh, captured as static plans capture it, with every eviction
// made from inside a kernel (the allocator asking for room). Returns the step's graph.
schedule::StepGraph captured_tanh_step(int64_t capacity, int n, int64_t* evictions) {
  auto arena = std::make_shared<CpuArena>(capacity);
  ArenaScope scope(arena);
  MemoryManager memory;
  MemoryOptions options = MemoryOptions::budget(arena, EvictionHeuristic::kLru);
  options.eviction_threshold = 1.0;  // nothing evicted before a kernel: only while it runs
  StaticPlanOptions capture;
  capture.capture_only = true;
  options.static_plans = capture;
  Interpreter interp{{}, &memory};
  memory.configure(options);
  Tensor x = interp.input(at::linspace(-1, 1, 16 * kKiB));
  Tensor w = interp.param(at::full({16 * kKiB}, 0.5).requires_grad_());
  memory.begin_step();
  Tensor y = mul(x, w);
  for (int i = 0; i < n; ++i) y = tanh(y);
  Tensor loss = sum(y);
  y.reset();
  interp.backward(loss);
  loss.reset();
  memory.end_step();
  *evictions = memory.stats().evictions;
  return memory.static_planner()->last_step()->graph;
}

TEST(MemoryManager, CapturedWorkingMemoryCountsWhatTheKernelEvicted) {
  // A static plan is solved from a step captured under DTR. A kernel that had to evict to run
  // needed those bytes all the same: a plan keeping the victim must leave room for both, so the
  // capture measures every kernel as it would with room to spare. (Measured as the arena's peak
  // alone, three of tanh's backward stages here read 65600 bytes of 131136.)
  int64_t roomy_evictions = 0, tight_evictions = 0;
  const schedule::StepGraph roomy = captured_tanh_step(64 * 1024 * kKiB, 8, &roomy_evictions);
  const schedule::StepGraph tight = captured_tanh_step(448 * kKiB, 8, &tight_evictions);
  ASSERT_EQ(roomy_evictions, 0);
  ASSERT_GT(tight_evictions, 0);
  ASSERT_EQ(roomy.forward.size(), tight.forward.size());
  ASSERT_EQ(roomy.backward.size(), tight.backward.size());
  for (size_t k = 0; k < roomy.forward.size(); ++k)
    EXPECT_EQ(roomy.forward[k].working_bytes, tight.forward[k].working_bytes) << "forward op " << k;
  for (size_t s = 0; s < roomy.backward.size(); ++s)
    EXPECT_EQ(roomy.backward[s].working_bytes, tight.backward[s].working_bytes) << "backward stage " << s;
}

}  // namespace
}  // namespace ht

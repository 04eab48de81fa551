// Each eviction policy's choice on hand-built graphs: tensors made by real ops, then their
// compute cost, staleness and residency set by hand so that each policy's rule decides.
#include "alloc/cpu_arena.h"
#include "alloc/cpu_device_allocator.h"
#include "memory/eviction_policy.h"
#include "memory/memory_manager.h"
#include "runtime/interpreter.h"
#include "runtime/ops.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <optional>

namespace ht {
namespace {

// The cost every policy weighs, whichever the job chose (memory.kernel_costs).
void set_cost(const Tensor& t, double ms) {
  t.info()->producer->compute_ms = ms;
  t.info()->producer->modeled_ms = ms;
}

// An interpreter whose memory manager runs `heuristic` (over an arena that is not active, so it
// never evicts by itself): the policy sees every drop and regeneration, as in training.
struct Graph {
  explicit Graph(EvictionHeuristic heuristic, bool sqrt_sampling = false, bool ignore_small = false,
                 uint64_t seed = 0, KernelCosts costs = KernelCosts::kModeled) {
    EvictionOptions e;
    e.heuristic = heuristic;
    e.costs = costs;
    e.sqrt_sampling = sqrt_sampling;
    e.ignore_small = ignore_small;
    e.seed = seed;
    MemoryOptions m;
    m.arena = std::make_shared<CpuArena>(1 << 20);
    m.eviction = e;
    memory.configure(m);
  }
  TensorInfo* victim() { return memory.evictor()->pick_victim(memory.candidates(), now); }
  Tensor leaf(int64_t n) { return interp.input(at::ones({n})); }

  MemoryManager memory;

  Interpreter interp{{}, &memory};
  uint64_t now = 1000;
};

TEST(EvictionPolicy, LruEvictsTheStalest) {
  Graph g(EvictionHeuristic::kLru);
  Tensor x = g.leaf(256);
  Tensor a = relu(x), b = relu(x), c = relu(x);
  a.info()->last_access = 500;
  b.info()->last_access = 100;
  c.info()->last_access = 900;
  EXPECT_EQ(g.victim(), b.info());
}

TEST(EvictionPolicy, LargestEvictsTheBiggest) {
  Graph g(EvictionHeuristic::kLargest);
  Tensor a = relu(g.leaf(256)), b = relu(g.leaf(1024)), c = relu(g.leaf(512));
  EXPECT_EQ(g.victim(), b.info());
}

TEST(EvictionPolicy, DtrTradesCostAgainstBytesTimesStaleness) {
  Graph g(EvictionHeuristic::kDtr);
  Tensor x = g.leaf(256), big = g.leaf(1024);
  Tensor cheap = relu(x), dear = relu(x), large = relu(big), fresh = relu(x);
  for (const Tensor* t : {&cheap, &dear, &large, &fresh}) {
    set_cost(*t, 1.0);
    t->info()->last_access = 900;  // staleness 101
  }
  set_cost(dear, 10.0);
  fresh.info()->last_access = 999;  // staleness 2
  // h = c / (m * s): large has 4x the bytes of cheap at the same cost and staleness.
  EXPECT_EQ(g.victim(), large.info());
  large.reset();
  EXPECT_EQ(g.victim(), cheap.info()) << "dear costs 10x, fresh is 50x less stale";
}

// memory.kernel_costs: the policies weigh the modelled cost unless told to weigh measured times.
TEST(EvictionPolicy, WeighsModeledCostsUnlessToldToMeasure) {
  for (EvictionHeuristic h : {EvictionHeuristic::kDtr, EvictionHeuristic::kDtrEq, EvictionHeuristic::kMegEngine}) {
    for (KernelCosts costs : {KernelCosts::kModeled, KernelCosts::kMeasured}) {
      Graph g(h, false, false, 0, costs);
      Tensor x = g.leaf(256);
      Tensor slow = relu(x), dear = relu(x);
      slow.info()->producer->compute_ms = 10;  // timed on a busy machine
      slow.info()->producer->modeled_ms = 1;
      dear.info()->producer->compute_ms = 1;
      dear.info()->producer->modeled_ms = 10;
      slow.info()->last_access = dear.info()->last_access = 900;
      EXPECT_EQ(g.victim(), costs == KernelCosts::kModeled ? slow.info() : dear.info())
          << choice_name(h) << " weighing " << choice_name(costs) << " costs";
    }
  }
}

// Two candidates alike in cost, bytes and staleness; `a` borders an evicted chain e1 -> e2 -> a
// (cost 100 two hops away, 1 one hop away), `b` borders one evicted tensor e3 of cost 50.
// dtr counts the whole evicted neighbourhood (a: +101, b: +50) and evicts b; a one-hop view
// (megengine) sees a: +1, b: +50 and evicts a.
struct NeighbourhoodGraph {
  explicit NeighbourhoodGraph(EvictionHeuristic h) : g(h) {
    Tensor x = g.leaf(256);
    e1 = relu(x);
    e2 = relu(e1);
    a = relu(e2);
    e3 = relu(x);
    b = relu(e3);
    set_cost(e1, 100);
    set_cost(e2, 1);
    set_cost(e3, 50);
    set_cost(a, 1);
    set_cost(b, 1);
    for (Tensor* t : {&e1, &e2, &e3}) g.interp.evict(*t->info());
    for (Tensor* t : {&a, &b}) t->info()->last_access = 900;
  }
  Graph g;
  Tensor e1, e2, e3, a, b;
};

TEST(EvictionPolicy, DtrCountsTheWholeEvictedNeighbourhood) {
  NeighbourhoodGraph n(EvictionHeuristic::kDtr);
  EXPECT_DOUBLE_EQ(evicted_neighbourhood_cost(*n.a.info()), 101);
  EXPECT_DOUBLE_EQ(evicted_neighbourhood_cost(*n.b.info()), 50);
  EXPECT_EQ(n.g.victim(), n.b.info());
}

TEST(EvictionPolicy, DtrEqUsesEquivalenceClassesOfEvictedTensors) {
  NeighbourhoodGraph n(EvictionHeuristic::kDtrEq);
  EXPECT_EQ(n.g.victim(), n.b.info()) << "e1 and e2 form one class of cost 101 next to a";
  // Regenerating e2 takes it out of the class, and a no longer borders an evicted tensor.
  n.e2.value();  // regenerates e1 too, which stays (the test holds it)
  EXPECT_TRUE(n.e2.info()->resident());
  n.e1.info()->last_access = n.e2.info()->last_access = 999;  // fresh: out of the running
  EXPECT_EQ(n.g.victim(), n.a.info());
}

TEST(EvictionPolicy, MegEngineLooksOneHop) {
  NeighbourhoodGraph n(EvictionHeuristic::kMegEngine);
  EXPECT_EQ(n.g.victim(), n.a.info());
}

TEST(EvictionPolicy, MegEnginePrefersBlocksNextToFreeMemoryUnlessOftenRecomputed) {
  auto arena = std::make_shared<CpuArena>(1 << 20);
  ArenaScope scope(arena);
  EvictionOptions e;
  e.heuristic = EvictionHeuristic::kMegEngine;
  e.sqrt_sampling = false;
  MemoryOptions m;
  m.arena = arena;
  m.eviction = e;
  MemoryManager memory;
  Interpreter interp{{}, &memory};
  memory.configure(m);
  Tensor x = interp.input(at::ones({1024}));
  Tensor a = relu(x);
  Tensor b = relu(x);
  // Placed among the activations, as a kernel's outputs would be.
  std::optional<PlacementScope> among_activations(Placement::kActivation);
  at::Tensor hole = at::empty({1024});  // just after b
  Tensor c = relu(x);
  // The rest of the arena, so that no candidate borders the free tail.
  at::Tensor filler = at::empty({arena->stats().largest_free_block / 4});
  among_activations.reset();
  ASSERT_LT(a.value().data_ptr(), b.value().data_ptr());
  ASSERT_LT(b.value().data_ptr(), hole.data_ptr());
  ASSERT_LT(hole.data_ptr(), c.value().data_ptr());
  hole.reset();
  ASSERT_EQ(arena->adjacent_free_bytes(b.value().data_ptr()), 4096);
  ASSERT_EQ(arena->adjacent_free_bytes(a.value().data_ptr()), 0);
  for (Tensor* t : {&a, &b, &c}) {
    set_cost(*t, 1);
    t->info()->last_access = 900;
  }
  c.info()->last_access = 999;  // fresh: out of the running
  auto victim = [&] { return memory.evictor()->pick_victim(memory.candidates(), 1000); };
  EXPECT_EQ(victim(), b.info()) << "evicting b makes a hole of 8 KiB";
  b.info()->recompute_count = 5;  // 1.25^5 = 3.05 outweighs the 2x of the free neighbour
  EXPECT_EQ(victim(), a.info());
}

TEST(EvictionPolicy, NeverPicksWhatCannotBeEvicted) {
  Graph g(EvictionHeuristic::kLargest);
  Tensor x = g.leaf(4096);  // a leaf is never a candidate
  Tensor small = relu(g.leaf(16));
  Tensor pinned = relu(x);
  ++pinned.info()->pin_count;
  EXPECT_EQ(g.victim(), small.info());
  small.info()->pin_count++;
  EXPECT_EQ(g.victim(), nullptr);
  small.info()->pin_count--;
  pinned.info()->pin_count--;
}

TEST(EvictionPolicy, SmallTensorFilterSkipsTensorsUnderOnePercentOfTheMean) {
  for (bool ignore_small : {false, true}) {
    Graph g(EvictionHeuristic::kLru, /*sqrt_sampling=*/false, ignore_small);
    // Sizes are what evicting frees, whole blocks of the arena: tiny's 4 bytes take 64.
    Tensor tiny = relu(g.leaf(1));
    tiny.info()->last_access = 1;  // the stalest by far
    std::vector<Tensor> big;
    for (int i = 0; i < 10; ++i) {
      big.push_back(relu(g.leaf(16384)));
      big.back().info()->last_access = 500 + i;
    }
    EXPECT_EQ(g.victim(), ignore_small ? big[0].info() : tiny.info()) << "ignore_small " << ignore_small;
  }
}

TEST(EvictionPolicy, SqrtSamplingScoresAFewCandidates) {
  // 100 candidates with distinct staleness: without sampling lru always finds the stalest; with
  // sqrt(N) = 10 random candidates per pick it usually does not, and always picks a candidate.
  for (bool sampling : {false, true}) {
    Graph g(EvictionHeuristic::kLru, sampling, false, /*seed=*/3);
    Tensor x = g.leaf(64);
    std::vector<Tensor> ts;
    for (int i = 0; i < 100; ++i) {
      ts.push_back(relu(x));
      ts.back().info()->last_access = static_cast<uint64_t>(100 + i);
    }
    int stalest = 0;
    for (int k = 0; k < 50; ++k) {
      TensorInfo* v = g.victim();
      ASSERT_NE(v, nullptr);
      stalest += v == ts[0].info();
    }
    if (sampling) {
      EXPECT_LT(stalest, 25) << "10 of 100 sampled: the stalest is in about 1 pick of 10";
    } else {
      EXPECT_EQ(stalest, 50);
    }
  }
}

TEST(EvictionWindow, FindsTheCheapestRunOfAdjacentBlocksThatSpansTheRequest) {
  auto free = [](int64_t bytes) { return ArenaBlock{bytes, true, 0}; };
  auto tensor = [](int64_t bytes, double cost) { return ArenaBlock{bytes, true, cost}; };
  auto pinned = [](int64_t bytes) { return ArenaBlock{bytes, false, 0}; };
  using Window = std::pair<int64_t, int64_t>;
  // Free blocks cost nothing: a tensor between two holes is cheaper than two tensors.
  EXPECT_EQ(cheapest_window({tensor(64, 1), tensor(64, 1), free(32), tensor(64, 1.5), free(32)}, 128), Window(2, 5));
  // The shortest run that spans it, not a longer one around it.
  EXPECT_EQ(cheapest_window({tensor(64, 5), tensor(128, 2), tensor(64, 5)}, 128), Window(1, 2));
  // A pinned block breaks a run: 2 + 2 across it would be cheapest.
  EXPECT_EQ(cheapest_window({tensor(64, 9), tensor(64, 2), pinned(64), tensor(64, 2), tensor(64, 9)}, 128),
            Window(0, 2));
  // Equal costs: the lowest address.
  EXPECT_EQ(cheapest_window({tensor(64, 1), tensor(64, 1), tensor(64, 1)}, 64), Window(0, 1));
  // Nothing spans it.
  EXPECT_EQ(cheapest_window({tensor(64, 1), pinned(64), tensor(64, 1)}, 128), Window(-1, -1));
  EXPECT_EQ(cheapest_window({}, 1), Window(-1, -1));
  // A window's cost is the candidate's: its score (per byte) times its bytes.
  EXPECT_DOUBLE_EQ(window_cost(0.5, 64), 32.0);
  EXPECT_DOUBLE_EQ(window_cost(-1, 64), 0.0) << "never negative";
}

TEST(EvictionPolicy, NamesRoundTrip) {
  for (const char* name : {"dtr", "dtr_eq", "megengine", "lru", "largest"}) {
    const auto h = parse_choice<EvictionHeuristic>(name);
    ASSERT_TRUE(h.has_value()) << name;
    EXPECT_STREQ(choice_name(*h), name);
  }
  EXPECT_FALSE(parse_choice<EvictionHeuristic>("dtr-eq").has_value());
}

}  // namespace
}  // namespace ht

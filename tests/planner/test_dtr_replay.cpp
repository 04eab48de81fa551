// The offline DTR replay on hand-built traces: what it evicts, regenerates and counts, where it
// gives up, and that it mirrors the memory manager's choices (policy, fragmentation first).
#include "planner/dtr_replay.h"

#include <gtest/gtest.h>

#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace ht {
namespace {

constexpr int64_t kMiB = 1 << 20;

// Appends kernels, tensors and events to a trace in the order a step would record them.
struct TraceBuilder {
  int kernel(double ms, std::vector<int> inputs, bool backward = false, bool recomputable = true) {
    TraceKernel k;
    k.ms = ms;
    k.inputs = std::move(inputs);
    k.backward = backward;
    k.recomputable = recomputable;
    trace.kernels.push_back(std::move(k));
    return static_cast<int>(trace.kernels.size()) - 1;
  }
  int tensor(int64_t bytes, int producer, bool low_end) {
    TraceTensor t;
    t.bytes = bytes;
    t.producer = producer;
    t.low_end = low_end;
    trace.tensors.push_back(t);
    return static_cast<int>(trace.tensors.size()) - 1;
  }
  void event(TraceEvent::Kind kind, int index) { trace.events.push_back({kind, index}); }
  void begin(int k) { event(TraceEvent::Kind::kKernelBegins, k); }
  void end(int k) { event(TraceEvent::Kind::kKernelEnds, k); }
  void free(int t) { event(TraceEvent::Kind::kFreed, t); }
  int alloc(int64_t bytes, int producer, bool low_end) {
    const int t = tensor(bytes, producer, low_end);
    event(TraceEvent::Kind::kAllocated, t);
    return t;
  }
  // A forward op call with one output at the arena's low end; returns the output.
  int forward(double ms, std::vector<int> inputs, int64_t bytes, bool recomputable = true) {
    const int k = kernel(ms, std::move(inputs), false, recomputable);
    begin(k);
    const int out = alloc(bytes, k, true);
    end(k);
    return out;
  }
  // A backward kernel reading saved values and writing one gradient (high end); returns it.
  int backward(std::vector<int> saved, int64_t grad_bytes) {
    const int k = kernel(0.5, std::move(saved), true);
    begin(k);
    const int grad = alloc(grad_bytes, -1, false);
    end(k);
    return grad;
  }

  StepTrace trace;
};

ReplayResult replay(const StepTrace& trace, int64_t budget, EvictionHeuristic policy = EvictionHeuristic::kDtr,
                    double threshold = 0.9) {
  ReplayOptions o;
  o.budget_bytes = budget;
  o.policy = policy;
  o.eviction_threshold = threshold;
  return replay_step(trace, o);
}

constexpr int kChain = 16;
constexpr double kForwardMs = 2.0;
constexpr int64_t kPersistent = 4 * kMiB;

// A batch x, kChain forward kernels a_i = f_i(a_{i-1}) of 1 MiB each saved for backward, then
// backward kernels in reverse reading a_i and a_{i-1}; each gradient is freed after the next
// backward kernel, each activation after its last reader.
StepTrace chain_trace() {
  TraceBuilder b;
  b.trace.persistent_bytes = kPersistent;
  std::vector<int> a{b.alloc(kMiB, -1, false)};  // the batch: not regenerable
  for (int i = 1; i <= kChain; ++i) a.push_back(b.forward(kForwardMs, {a.back()}, kMiB));
  int previous_grad = -1;
  for (int i = kChain; i >= 1; --i) {
    const int grad = b.backward({a[i], a[i - 1]}, kMiB);
    if (previous_grad >= 0) b.free(previous_grad);
    b.free(a[i]);
    previous_grad = grad;
  }
  b.free(previous_grad);
  b.free(a[0]);
  return b.trace;
}

// Persistent + batch + every activation + the first gradient, or (one activation fewer) two
// gradients: the highest point of the step without eviction.
constexpr int64_t kChainPeak = kPersistent + (kChain + 2) * kMiB;

TEST(DtrReplay, UnlimitedBudgetEvictsNothing) {
  const ReplayResult r = replay(chain_trace(), 1024 * kMiB);
  EXPECT_TRUE(r.feasible);
  EXPECT_EQ(r.peak_bytes, kChainPeak);
  EXPECT_EQ(r.evictions, 0);
  EXPECT_EQ(r.recomputations, 0);
  EXPECT_EQ(r.recompute_ms, 0);
  EXPECT_TRUE(r.failure.empty());
}

TEST(DtrReplay, SmallerBudgetEvictsAndRegenerates) {
  for (EvictionHeuristic policy : {EvictionHeuristic::kDtr, EvictionHeuristic::kLru, EvictionHeuristic::kLargest}) {
    SCOPED_TRACE(static_cast<int>(policy));
    const int64_t budget = kPersistent + 10 * kMiB;
    ASSERT_LT(budget, kChainPeak);
    const ReplayResult r = replay(chain_trace(), budget, policy);
    EXPECT_TRUE(r.feasible) << r.failure;
    EXPECT_GT(r.evictions, 0);
    EXPECT_GT(r.recomputations, 0);
    // Every forward kernel takes kForwardMs: the time is one per regeneration.
    EXPECT_DOUBLE_EQ(r.recompute_ms, kForwardMs * static_cast<double>(r.recomputations));
    EXPECT_LE(r.peak_bytes, budget);
    EXPECT_EQ(r.min_budget_bytes, 0);
  }
}

TEST(DtrReplay, BudgetBelowOneKernelsNeedIsInfeasible) {
  // The last backward kernel pins a_N and a_{N-1}, the batch stays, and its gradient needs 1 MiB
  // more: persistent + 3 MiB cannot hold it.
  const int64_t budget = kPersistent + 3 * kMiB;
  const ReplayResult r = replay(chain_trace(), budget);
  EXPECT_FALSE(r.feasible);
  EXPECT_GT(r.min_budget_bytes, budget);
  EXPECT_EQ(r.min_budget_bytes, kPersistent + 4 * kMiB);
  EXPECT_NE(r.failure.find("kernel " + std::to_string(kChain)), std::string::npos) << r.failure;
  EXPECT_NE(r.failure.find("needs 1.00 MiB beside "), std::string::npos) << r.failure;
  EXPECT_NE(r.failure.find("(" + std::to_string(kPersistent + 4 * kMiB) + " bytes), more than the budget's 7.00 MiB (" +
                           std::to_string(budget) + " bytes)"), std::string::npos) << r.failure;
  // A lower bound, not a promise: the next backward kernel holds two gradients at once.
  EXPECT_FALSE(replay(chain_trace(), r.min_budget_bytes).feasible);
  EXPECT_TRUE(replay(chain_trace(), kPersistent + 5 * kMiB).feasible);
}

TEST(DtrReplay, PersistentStateLargerThanTheBudgetIsInfeasible) {
  TraceBuilder b;
  b.trace.persistent_bytes = 2 * kMiB;
  const ReplayResult r = replay(b.trace, kMiB);
  EXPECT_FALSE(r.feasible);
  EXPECT_EQ(r.min_budget_bytes, 2 * kMiB);
}

// A (1 MiB, 3 ms) then B (2 MiB, 5 ms), a kernel that needs 1 MiB with the arena full, then a
// kernel that reads both: the one evicted is regenerated, and its time tells which it was.
StepTrace lru_vs_largest_trace() {
  TraceBuilder b;
  b.trace.persistent_bytes = kMiB;
  const int a = b.forward(3.0, {}, kMiB);
  const int bb = b.forward(5.0, {}, 2 * kMiB);
  const int k = b.kernel(1.0, {});
  b.begin(k);
  const int tmp = b.alloc(kMiB, -1, true);
  b.end(k);
  b.free(tmp);
  const int reader = b.kernel(1.0, {a, bb});
  b.begin(reader);
  b.end(reader);
  return b.trace;
}

TEST(DtrReplay, LruEvictsTheStalestAndLargestTheBiggest) {
  // Threshold 1: only the failed allocation evicts, so the policy alone decides.
  const ReplayResult lru = replay(lru_vs_largest_trace(), 4 * kMiB, EvictionHeuristic::kLru, 1.0);
  ASSERT_TRUE(lru.feasible) << lru.failure;
  EXPECT_EQ(lru.evictions, 1);
  EXPECT_EQ(lru.recomputations, 1);
  EXPECT_DOUBLE_EQ(lru.recompute_ms, 3.0);  // A

  const ReplayResult largest = replay(lru_vs_largest_trace(), 4 * kMiB, EvictionHeuristic::kLargest, 1.0);
  ASSERT_TRUE(largest.feasible) << largest.failure;
  EXPECT_EQ(largest.evictions, 1);
  EXPECT_EQ(largest.recomputations, 1);
  EXPECT_DOUBLE_EQ(largest.recompute_ms, 5.0);  // B
}

TEST(DtrReplay, DtrCountsTheEvictedNeighbourhood) {
  // r (2.4 ms), then p (1 ms) and q = g(p) (1 ms); p is freed (g does not save it), which leaves
  // a hole between r and q: both may be evicted to make 2 MiB, so the score decides. Staleness
  // 4 and 2: r scores 2.4 / 4 = 0.6 per byte, q 1 / 2 = 0.5 alone but (1 + 1) / 2 = 1 with p's
  // cost, the evicted neighbour it would drag along. DTR evicts r.
  TraceBuilder b;
  const int r = b.forward(2.4, {}, kMiB);
  const int p = b.forward(1.0, {}, kMiB);
  const int q = b.forward(1.0, {p}, kMiB);
  b.free(p);
  const int k = b.kernel(1.0, {});
  b.begin(k);
  const int big = b.alloc(2 * kMiB, -1, true);
  b.end(k);
  b.free(big);
  const int reader = b.kernel(1.0, {q, r});
  b.begin(reader);
  b.end(reader);
  const ReplayResult dtr = replay(b.trace, 3 * kMiB, EvictionHeuristic::kDtr, 1.0);
  ASSERT_TRUE(dtr.feasible) << dtr.failure;
  EXPECT_EQ(dtr.evictions, 1);
  EXPECT_EQ(dtr.recomputations, 1);
  EXPECT_DOUBLE_EQ(dtr.recompute_ms, 2.4);  // r; q would have needed p too: 2 kernels, 2 ms
}

TEST(DtrReplay, NonRecomputableOutputIsNeverEvicted) {
  // The largest tensor comes from a non-recomputable kernel: B must go instead.
  TraceBuilder b;
  const int a = b.forward(3.0, {}, 2 * kMiB, /*recomputable=*/false);
  const int bb = b.forward(5.0, {}, kMiB);
  const int k = b.kernel(1.0, {});
  b.begin(k);
  const int tmp = b.alloc(kMiB, -1, true);
  b.end(k);
  b.free(tmp);
  const int reader = b.kernel(1.0, {a, bb});
  b.begin(reader);
  b.end(reader);
  const ReplayResult r = replay(b.trace, 3 * kMiB, EvictionHeuristic::kLargest, 1.0);
  ASSERT_TRUE(r.feasible) << r.failure;
  EXPECT_EQ(r.evictions, 1);
  EXPECT_DOUBLE_EQ(r.recompute_ms, 5.0);

  // With B pinned by the kernel that allocates, nothing may go: infeasible.
  TraceBuilder c;
  c.forward(3.0, {}, 2 * kMiB, false);
  const int pinned = c.forward(5.0, {}, kMiB);
  const int k2 = c.kernel(1.0, {pinned});
  c.begin(k2);
  c.alloc(kMiB, -1, true);
  c.end(k2);
  const ReplayResult none = replay(c.trace, 3 * kMiB, EvictionHeuristic::kLargest, 1.0);
  EXPECT_FALSE(none.feasible);
  EXPECT_EQ(none.evictions, 0);
  EXPECT_EQ(none.min_budget_bytes, 4 * kMiB);
}

// A refusal states one limit, the bytes against it and why, in numbers that add up: here the
// budget holds what must be held at once, but its free memory is in pieces. (Before, this said
// "needs 2097152 bytes with 1048576 bytes in use that cannot be evicted, more than the budget of
// 3145728 bytes (at least 3145728 needed)".)
TEST(DtrReplay, ARefusalForFragmentationSaysSoInNumbersThatAddUp) {
  TraceBuilder b;
  const int p1 = b.forward(1.0, {}, kMiB, /*recomputable=*/false);
  b.forward(1.0, {}, kMiB, /*recomputable=*/false);
  const int p3 = b.forward(1.0, {}, kMiB, /*recomputable=*/false);
  b.free(p1);
  b.free(p3);
  b.forward(1.0, {}, 2 * kMiB);
  const ReplayResult r = replay(b.trace, 3 * kMiB);
  ASSERT_FALSE(r.feasible);
  EXPECT_EQ(r.failure, "kernel 3 (?) needs a block of 2.00 MiB (2097152 bytes); the 1.00 MiB that cannot be evicted "
                       "leave 2.00 MiB of the budget's 3.00 MiB free, but in pieces, the largest 1.00 MiB (1048576 "
                       "bytes): fragmentation");
  // Without the hole in the middle, too little room at all: the sum, and the budget it passes.
  TraceBuilder c;
  c.forward(1.0, {}, 2 * kMiB, /*recomputable=*/false);
  c.forward(1.0, {}, 2 * kMiB);
  const ReplayResult tight = replay(c.trace, 3 * kMiB);
  ASSERT_FALSE(tight.feasible);
  EXPECT_EQ(tight.failure, "kernel 1 (?) needs 2.00 MiB beside 2.00 MiB that cannot be evicted: 4.00 MiB (4194304 "
                           "bytes), more than the budget's 3.00 MiB (3145728 bytes)");
  EXPECT_EQ(tight.min_budget_bytes, 4 * kMiB);
}

TEST(DtrReplay, FragmentationEvictsTheTensorBetweenTwoHoles) {
  // Low end: T1 (2 MiB) T2 (1) T3 (2) P (1, non-recomputable) T4 (2.5); persistent (1) on top.
  // T1 and T3 are freed: 4 MiB free, but no block over 2 MiB. A 3 MiB request: `largest` alone
  // would evict T4 (its 2.5 MiB hole is still too small) and then T2; evicting T2 alone joins
  // the two holes into 5 MiB, and that is what make_room does first.
  TraceBuilder b;
  b.trace.persistent_bytes = kMiB;
  const int t1 = b.forward(1.0, {}, 2 * kMiB);
  const int t2 = b.forward(7.0, {}, kMiB);
  const int t3 = b.forward(1.0, {}, 2 * kMiB);
  b.forward(1.0, {}, kMiB, /*recomputable=*/false);
  const int t4 = b.forward(11.0, {}, 5 * kMiB / 2);
  b.free(t1);
  b.free(t3);
  const int k = b.kernel(1.0, {});
  b.begin(k);
  const int request = b.alloc(3 * kMiB, -1, true);
  b.end(k);
  b.free(request);
  const int reader = b.kernel(1.0, {t2, t4});
  b.begin(reader);
  b.end(reader);

  const int64_t budget = 9 * kMiB + kMiB / 2;
  const ReplayResult r = replay(b.trace, budget, EvictionHeuristic::kLargest, 1.0);
  ASSERT_TRUE(r.feasible) << r.failure;
  EXPECT_EQ(r.evictions, 1);
  EXPECT_EQ(r.recomputations, 1);
  EXPECT_DOUBLE_EQ(r.recompute_ms, 7.0);  // T2, not T4
  EXPECT_LE(r.peak_bytes, budget);
}

TEST(DtrReplay, RegenerationRegeneratesEvictedInputsFirst) {
  // x -> a -> b -> c, all evicted to make room, then a kernel reads c: b and a come back first.
  TraceBuilder b;
  const int x = b.alloc(kMiB, -1, false);
  const int a = b.forward(1.0, {x}, kMiB);
  const int bb = b.forward(2.0, {a}, kMiB);
  const int c = b.forward(4.0, {bb}, kMiB);
  const int k = b.kernel(1.0, {x});
  b.begin(k);
  const int big = b.alloc(3 * kMiB, -1, true);
  b.end(k);
  b.free(big);
  const int reader = b.kernel(1.0, {c});
  b.begin(reader);
  b.end(reader);
  const ReplayResult r = replay(b.trace, 4 * kMiB, EvictionHeuristic::kDtr, 1.0);
  ASSERT_TRUE(r.feasible) << r.failure;
  EXPECT_EQ(r.evictions, 3);
  EXPECT_EQ(r.recomputations, 3);
  EXPECT_DOUBLE_EQ(r.recompute_ms, 7.0);
  EXPECT_LE(r.peak_bytes, 4 * kMiB);
}

TEST(DtrReplay, RegeneratesAFreedIntermediateInPassing) {
  // a is freed once b is made from it (b's op does not save it); b is evicted and needed again.
  // The engine still holds a's record (b's lineage) and regenerates it for the moment: so does
  // the replay, and lets it go again.
  TraceBuilder b;
  const int a = b.forward(1.0, {}, kMiB);
  const int bb = b.forward(2.0, {a}, kMiB);
  b.free(a);
  const int k = b.kernel(1.0, {});
  b.begin(k);
  const int big = b.alloc(2 * kMiB, -1, true);
  b.end(k);
  b.free(big);
  const int reader = b.kernel(1.0, {bb});
  b.begin(reader);
  const int out = b.alloc(kMiB, reader, true);  // fits only once a is gone again
  b.end(reader);
  b.free(out);
  const ReplayResult r = replay(b.trace, 2 * kMiB, EvictionHeuristic::kDtr, 1.0);
  ASSERT_TRUE(r.feasible) << r.failure;
  EXPECT_EQ(r.evictions, 1);
  EXPECT_EQ(r.recomputations, 2);
  EXPECT_DOUBLE_EQ(r.recompute_ms, 3.0);
}

TEST(DtrReplay, RegenerationThroughAFreedBatchFails) {
  // The batch x has no producer: once freed, nothing regenerates a = f(x) after its eviction.
  TraceBuilder b;
  const int x = b.alloc(kMiB, -1, false);
  const int a = b.forward(1.0, {x}, kMiB);
  b.free(x);
  const int k = b.kernel(1.0, {});
  b.begin(k);
  const int big = b.alloc(2 * kMiB, -1, true);
  b.end(k);
  b.free(big);
  const int reader = b.kernel(1.0, {a});
  b.begin(reader);
  b.end(reader);
  const ReplayResult r = replay(b.trace, 2 * kMiB, EvictionHeuristic::kDtr, 1.0);
  EXPECT_FALSE(r.feasible);
  EXPECT_EQ(r.min_budget_bytes, 0);
  EXPECT_NE(r.failure.find("kernel " + std::to_string(reader)), std::string::npos) << r.failure;
  EXPECT_NE(r.failure.find("tensor " + std::to_string(x)), std::string::npos) << r.failure;
}

// `blocks` blocks of `ops` forward op calls, each reading the block's input or an earlier output
// of its block (its output 64 KiB to 96 MiB, some with a temporary beside it), then backward in
// reverse: each op's backward reads its inputs and output, makes a gradient, and frees the output.
StepTrace random_block_trace(std::mt19937& rng, int blocks, int ops) {
  auto bytes = [&] {
    const int64_t sizes[] = {64 << 10, 512 << 10, 3 * kMiB, 16 * kMiB, 40 * kMiB, 96 * kMiB};
    return sizes[std::uniform_int_distribution<int>(0, 5)(rng)];
  };
  TraceBuilder b;  // no persistent state, as the planner's block replays (recompute_terms.cpp)
  struct Op {
    int kernel, output;
  };
  std::vector<Op> forward;
  int input = b.alloc(8 * kMiB, -1, false);  // the batch
  for (int block = 0; block < blocks; ++block) {
    std::vector<int> made{input};
    for (int i = 0; i < ops; ++i) {
      std::vector<int> reads{made[std::uniform_int_distribution<size_t>(0, made.size() - 1)(rng)]};
      if (made.size() > 1 && rng() % 2 == 0) reads.push_back(made[made.size() - 2]);
      const int k = b.kernel(0.5 + static_cast<double>(rng() % 8), reads);
      b.trace.kernels[static_cast<size_t>(k)].modeled_ms = b.trace.kernels[static_cast<size_t>(k)].ms;
      b.trace.kernels[static_cast<size_t>(k)].block = block;
      b.begin(k);
      const int temporary = rng() % 3 == 0 ? b.alloc(bytes(), -1, true) : -1;
      const int out = b.alloc(bytes(), k, true);
      if (temporary >= 0) b.free(temporary);
      b.end(k);
      made.push_back(out);
      forward.push_back({k, out});
    }
    input = made.back();
  }
  int previous = -1;
  for (auto op = forward.rbegin(); op != forward.rend(); ++op) {
    std::vector<int> saved = b.trace.kernels[static_cast<size_t>(op->kernel)].inputs;
    saved.push_back(op->output);
    const int k = b.kernel(1.0, saved, true);
    b.trace.kernels[static_cast<size_t>(k)].block = b.trace.kernels[static_cast<size_t>(op->kernel)].block;
    b.begin(k);
    const int grad = b.alloc(bytes(), -1, false);
    b.end(k);
    if (previous >= 0) b.free(previous);
    b.free(op->output);
    previous = grad;
  }
  b.free(previous);
  return b.trace;
}

// The planner reuses a block replay the budget left alone (no eviction for room or threshold, no
// allocation without a free block that fits, no block placed where the arena's capacity put it)
// at every larger budget (planner/recompute_terms.cpp, held_from_below): its figures must be the
// larger budget's. Random block traces under full recomputation and per-block plans, each
// replayed at the smallest budget (to 1 MiB) the budget leaves alone, where the free range between
// the arena's ends is narrowest, then at larger ones: the same peak, forward end, evictions,
// regenerations and victims.
TEST(DtrReplay, AReplayTheBudgetLeftAloneHoldsAtEveryLargerBudget) {
  std::mt19937 rng(7);
  int acted = 0;  // trials whose edge is above the search's start: the budget acted below it
  for (int trial = 0; trial < 48; ++trial) {
    const StepTrace trace = random_block_trace(rng, 5, 8);
    ReplayOptions o;
    o.checkpoint_blocks = 5;
    o.block_keep_share = (trial % 3) * 0.4;  // 0: full recomputation
    auto at = [&](int64_t budget) {
      o.budget_bytes = budget;
      return replay_step(trace, o);
    };
    int64_t lo = 256 * kMiB, hi = 64 * 1024 * kMiB;  // small blocks are 1 MiB at both (CpuArena::small_block_bytes)
    ASSERT_FALSE(at(hi).budget_acted);
    if (at(lo).budget_acted) {
      ++acted;
      while (hi - lo > kMiB) {
        const int64_t mid = lo + (hi - lo) / 2;
        (at(mid).budget_acted ? lo : hi) = mid;
      }
    } else {
      hi = lo;
    }
    const ReplayResult least = at(hi);
    ASSERT_TRUE(least.feasible) << least.failure;
    for (int64_t more : {int64_t{64}, kMiB, 37 * kMiB, 700 * kMiB, 5 * 1024 * kMiB}) {
      const ReplayResult r = at(hi + more);
      SCOPED_TRACE("trial " + std::to_string(trial) + ", budget " + std::to_string(hi) + " + " + std::to_string(more));
      EXPECT_FALSE(r.budget_acted);
      EXPECT_EQ(r.peak_bytes, least.peak_bytes);
      EXPECT_EQ(r.forward_end_bytes, least.forward_end_bytes);
      EXPECT_EQ(r.evictions, least.evictions);
      EXPECT_EQ(r.recomputations, least.recomputations);
      EXPECT_EQ(r.recompute_ms, least.recompute_ms);
      EXPECT_EQ(r.victims, least.victims);
    }
  }
  EXPECT_GE(acted, 24) << "most trials must reach a budget that acts, or the edge is not tested";
}

TEST(DtrReplay, RejectsMalformedInput) {
  EXPECT_THROW(replay(chain_trace(), 0), std::invalid_argument);
  TraceBuilder b;
  const int k = b.kernel(1.0, {5});
  b.begin(k);
  EXPECT_THROW(replay(b.trace, kMiB), std::invalid_argument);
}

}  // namespace
}  // namespace ht

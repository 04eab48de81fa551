// Context parallelism's layout and attention against the one-rank computation: ranks are threads
// of one process (parallel/thread_group.h). Each rank holds its head and tail chunks of q, k and v;
// its output and gradients must be its part of the one-rank attention's, within fp32 reduction
// order, causal or not, with grouped-query heads, at 2 and 4 ranks.
#include "runtime/interpreter.h"
#include "runtime/ops.h"
#include "alloc/out_of_memory.h"
#include "parallel/thread_group.h"
#include "runtime/memory_hooks.h"

#include <gtest/gtest.h>

#include <set>

namespace ht::test::context_parallel_tests {

at::Tensor leaf(const at::Tensor& t) { return t.detach().clone().set_requires_grad(true); }

void expect_close(const at::Tensor& actual, const at::Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  EXPECT_TRUE(at::allclose(actual, expected, 1e-4, 1e-5))
      << what << ": max difference " << (actual - expected).abs().max().item<double>();
}

TEST(ContextLayout, EachRankHoldsAChunkFromTheFrontAndItsMirrorFromTheBack) {
  const ContextLayout layout{4, 1};
  const std::vector<SequencePiece> pieces = layout.pieces(16);  // chunks of 2
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[0].row, 0);
  EXPECT_EQ(pieces[0].position, 2);
  EXPECT_EQ(pieces[1].row, 2);
  EXPECT_EQ(pieces[1].position, 12);  // chunk 2c - 1 - r = 6
  EXPECT_TRUE(at::equal(layout.positions(16, at::kCPU), at::tensor({2, 3, 12, 13}, at::kLong)));
  const at::Tensor seq = at::arange(16, at::kLong).view({1, 16});
  EXPECT_TRUE(at::equal(layout.part_of(seq, 1), at::tensor({2, 3, 12, 13}, at::kLong).view({1, 4})));
  // by_rank and in_sequence_order undo each other, and by_rank's rows are part_of's.
  const at::Tensor stacked = layout.by_rank(seq, 1);  // (4, 1, 4)
  for (int64_t r = 0; r < 4; ++r) {
    EXPECT_TRUE(at::equal(stacked[r], (ContextLayout{4, r}.part_of(seq, 1)))) << "rank " << r;
  }
  EXPECT_TRUE(at::equal(layout.in_sequence_order(stacked, 1), seq));
  EXPECT_TRUE((ContextLayout{}.pieces(7).size() == 1 && ContextLayout{}.problem(7).empty()));
}

TEST(ContextLayout, ALengthThatDoesNotDivideIntoTwiceTheRanksNamesWhatWould) {
  const std::string problem = ContextLayout{4, 0}.problem(100);
  EXPECT_NE(problem.find("100 tokens does not divide into 2 x 4 chunks"), std::string::npos) << problem;
  EXPECT_NE(problem.find("use 96 or 104 tokens"), std::string::npos) << problem;
  EXPECT_TRUE((ContextLayout{4, 3}.problem(104).empty()));
  EXPECT_FALSE((ContextLayout{2, 2}.problem(8).empty()));  // no rank 2 of 2
}

struct AttentionCase {
  at::Tensor q, k, v, r;  // q (B, H, T, hd), k and v (B, Hkv, T, hd), r (B, H, T, hd) weights the sum
};

AttentionCase attention_case(int64_t t, int64_t h, int64_t hkv) {
  at::manual_seed(11);
  return {at::randn({2, h, t, 8}), at::randn({2, hkv, t, 8}), at::randn({2, hkv, t, 8}), at::randn({2, h, t, 8})};
}

// The loss sum(r * attention(q, k, v)) and the gradients of q, k and v, on one rank.
std::vector<at::Tensor> one_rank(const AttentionCase& c, bool causal) {
  Interpreter interp;
  at::Tensor q = leaf(c.q), k = leaf(c.k), v = leaf(c.v);
  const Tensor out = attention(interp.param(q), interp.param(k), interp.param(v), causal);
  interp.backward(sum(mul(out, interp.input(c.r))));
  return {out.value(), q.grad(), k.grad(), v.grad()};
}

// The same over `c` ranks of a context group, each holding its chunks of the sequence (dim 2):
// each rank's output and gradients are its part of the one-rank ones.
void split_attention(int c, int64_t t, int64_t h, int64_t hkv, bool causal,
                     ContextExchange exchange = ContextExchange::kAllGather) {
  const AttentionCase whole = attention_case(t, h, hkv);
  const std::vector<at::Tensor> expected = one_rank(whole, causal);
  run_ranks(c, [&](int rank, ThreadGroup& group) {
    const ContextLayout layout{c, rank};
    Interpreter interp;
    interp.set_context_parallel(&group);
    at::Tensor q = leaf(layout.part_of(whole.q, 2)), k = leaf(layout.part_of(whole.k, 2)),
               v = leaf(layout.part_of(whole.v, 2));
    const Tensor out =
        context_attention(interp.param(q), interp.param(k), interp.param(v), causal, 0.0, true, std::nullopt, exchange);
    EXPECT_TRUE(out.info()->producer->op->traits().collective);
    interp.backward(sum(mul(out, interp.input(layout.part_of(whole.r, 2)))));
    const std::string where = std::string(exchange == ContextExchange::kRing ? "ring" : "gather") + " c " + std::to_string(c) + " rank " + std::to_string(rank) + " T " + std::to_string(t) +
                              (causal ? " causal" : "") + " Hkv " + std::to_string(hkv);
    expect_close(out.value(), layout.part_of(expected[0], 2), where + " output");
    expect_close(q.grad(), layout.part_of(expected[1], 2), where + " dq");
    expect_close(k.grad(), layout.part_of(expected[2], 2), where + " dk");
    expect_close(v.grad(), layout.part_of(expected[3], 2), where + " dv");
    const int64_t gathered = 2 * hkv * t * 8;
    if (exchange == ContextExchange::kRing) {
      // Keys and values packed, passed c - 1 times each way; their gradients' sums c times.
      const int64_t chunk = 2 * (2 * hkv * (t / c) * 8);
      EXPECT_EQ(group.elements_by_use().at("context parallelism's key/value ring (forward)"), (c - 1) * chunk);
      EXPECT_EQ(group.elements_by_use().at("context parallelism's key/value ring (backward)"), (c - 1) * chunk);
      EXPECT_EQ(group.elements_by_use().at("context parallelism's key/value-gradient ring (backward)"), c * chunk);
      return;
    }
    // Keys and values gathered forward and again backward, their gradients reduce-scattered:
    // the key/value heads only, never the query heads they serve.
    EXPECT_EQ(group.elements_by_use().at("context parallelism's key all-gather (forward)"), gathered);
    EXPECT_EQ(group.elements_by_use().at("context parallelism's value all-gather (backward)"), gathered);
    EXPECT_EQ(group.elements_by_use().at("context parallelism's key-gradient reduce-scatter (backward)"), gathered);
  });
}

TEST(ContextAttention, CausalChunksOnTwoAndFourRanksAreTheOneRankAttention) {
  split_attention(2, 32, 4, 4, /*causal=*/true);
  split_attention(4, 32, 4, 4, /*causal=*/true);
  split_attention(2, 512, 4, 4, /*causal=*/true);  // pieces of 128 rows in blocks of 64
}

TEST(ContextAttention, TheRingIsTheOneRankAttention) {
  for (const int c : {2, 4}) {
    split_attention(c, 32, 4, 4, /*causal=*/true, ContextExchange::kRing);
    split_attention(c, 32, 4, 2, /*causal=*/true, ContextExchange::kRing);
    split_attention(c, 32, 4, 1, /*causal=*/false, ContextExchange::kRing);
  }
  split_attention(2, 512, 4, 4, /*causal=*/true, ContextExchange::kRing);  // pieces of 128 rows, several blocks
}

// Dropout under the ring: backward draws again the masks forward drew (each query block's against
// each piece of keys), so its gradients are the derivative of the forward that ran. Checked in
// double against a central difference along a random direction, summed over the group.
TEST(ContextAttention, TheRingsBackwardRedrawsItsDropoutMasks) {
  AttentionCase whole = attention_case(32, 4, 2);
  for (at::Tensor* t : {&whole.q, &whole.k, &whole.v, &whole.r}) *t = t->to(at::kDouble);
  const AttentionCase along{at::randn_like(whole.q), at::randn_like(whole.k), at::randn_like(whole.v), whole.r};
  run_ranks(2, [&](int rank, ThreadGroup& group) {
    const ContextLayout layout{2, rank};
    // The group's loss at q + eps dq (and k, v alike), and with `derivative` its gradients' dot
    // product with the direction.
    auto loss_at = [&](double eps, double* derivative, double dropout) {
      Interpreter interp;
      interp.set_context_parallel(&group);
      at::Tensor q = leaf(layout.part_of(whole.q + eps * along.q, 2)), k = leaf(layout.part_of(whole.k + eps * along.k, 2)),
                 v = leaf(layout.part_of(whole.v + eps * along.v, 2));
      const Tensor out = context_attention(interp.param(q), interp.param(k), interp.param(v), true, dropout, true,
                                           std::nullopt, ContextExchange::kRing);
      const Tensor loss = sum(mul(out, interp.input(layout.part_of(whole.r, 2))));
      at::Tensor sums = at::zeros({2}, at::kDouble);
      sums[0] = loss.value().item<double>();
      if (derivative != nullptr) {
        interp.backward(loss);
        sums[1] = (q.grad() * layout.part_of(along.q, 2)).sum().item<double>() +
                  (k.grad() * layout.part_of(along.k, 2)).sum().item<double>() +
                  (v.grad() * layout.part_of(along.v, 2)).sum().item<double>();
      }
      group.allreduce_sum(sums, "test");
      if (derivative != nullptr) *derivative = sums[1].item<double>();
      return sums[0].item<double>();
    };
    double analytic = 0;
    const double at_x = loss_at(0, &analytic, 0.3), eps = 1e-6;
    const double numeric = (loss_at(eps, nullptr, 0.3) - loss_at(-eps, nullptr, 0.3)) / (2 * eps);
    EXPECT_NEAR(analytic, numeric, 1e-6 * std::max(1.0, std::abs(numeric))) << "rank " << rank;
    EXPECT_GT(std::abs(at_x - loss_at(0, nullptr, 0.0)), 1e-3) << "dropout changed nothing";
  });
}

TEST(ContextAttention, GroupedQueryAndUnmaskedAttentionAreTheOneRankAttention) {
  split_attention(2, 32, 4, 2, /*causal=*/true);
  split_attention(4, 32, 4, 1, /*causal=*/true);
  split_attention(2, 32, 4, 2, /*causal=*/false);
  split_attention(4, 32, 4, 4, /*causal=*/false);
}

// A rank whose kernel finds no room is run again from its start (run_with_room); the ranks of a
// context group run out at different points (their causal blocks differ in size). A rank running
// its kernel again must not exchange again: here rank 0 finds no room after each exchange of keys
// (forward's and backward's gathers, the key gradients' reduce-scatter), before its next exchange,
// and both ranks still exchange once per use and get the one-rank attention's values. The ring
// (runtime/ops/ring_attention.cpp) goes on from where its kernel stopped: rank 0 finds no room
// before its backward's first pass of keys and values and before each pass of their gradients.
class RoomAfterEveryFailure final : public MemoryHooks {
 public:
  bool make_room_after(const OutOfBudget&) override { return true; }
};

class FailingOnceAfter final : public TensorParallelGroup {
 public:
  explicit FailingOnceAfter(ThreadGroup& group) : group_(group) {}
  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }
  void allreduce_sum(at::Tensor& t, const char* what) override { group_.allreduce_sum(t, what); }
  void all_gather(const at::Tensor& shard, at::Tensor& full, const char* what) override {
    fail_if_due();
    group_.all_gather(shard, full, what);
    due_ = std::string(what).find("key") != std::string::npos && failed_.insert(what).second;
  }
  void reduce_scatter_sum(const at::Tensor& full, at::Tensor& shard, const char* what) override {
    fail_if_due();
    group_.reduce_scatter_sum(full, shard, what);
    due_ = std::string(what).find("key") != std::string::npos && failed_.insert(what).second;
  }
  std::unique_ptr<RingPass> pass_along_ring(const at::Tensor& out, at::Tensor& in, const char* what) override {
    fail_if_due();
    auto pass = group_.pass_along_ring(out, in, what);
    due_ = failed_.insert(what).second || std::string(what).find("gradient") != std::string::npos;
    return pass;
  }
  int failures = 0;

 private:
  // The next exchange after a first one of keys finds no room (as an allocation between them would).
  void fail_if_due() {
    if (!due_) return;
    due_ = false;
    ++failures;
    throw OutOfBudget("no room (a test's)", 1, 0, 0, 0);
  }
  ThreadGroup& group_;
  std::set<std::string> failed_;
  bool due_ = false;
};

void run_again_for_room(ContextExchange exchange, int expected_failures) {
  const AttentionCase whole = attention_case(32, 4, 2);
  const std::vector<at::Tensor> expected = one_rank(whole, /*causal=*/true);
  run_ranks(2, [&](int rank, ThreadGroup& group) {
    const ContextLayout layout{2, rank};
    RoomAfterEveryFailure room;
    Interpreter interp({}, &room);
    FailingOnceAfter failing(group);
    interp.set_context_parallel(rank == 0 ? static_cast<TensorParallelGroup*>(&failing) : &group);
    at::Tensor q = leaf(layout.part_of(whole.q, 2)), k = leaf(layout.part_of(whole.k, 2)),
               v = leaf(layout.part_of(whole.v, 2));
    const Tensor out =
        context_attention(interp.param(q), interp.param(k), interp.param(v), true, 0.0, true, std::nullopt, exchange);
    interp.backward(sum(mul(out, interp.input(layout.part_of(whole.r, 2)))));
    const std::string where = "rank " + std::to_string(rank);
    if (rank == 0) EXPECT_EQ(failing.failures, expected_failures);
    expect_close(out.value(), layout.part_of(expected[0], 2), where + " output");
    expect_close(q.grad(), layout.part_of(expected[1], 2), where + " dq");
    expect_close(k.grad(), layout.part_of(expected[2], 2), where + " dk");
    expect_close(v.grad(), layout.part_of(expected[3], 2), where + " dv");
    // Each use once: the gradients' sums go round twice (c times), everything else once.
    for (const auto& [use, elements] : group.elements_by_use()) {
      const int64_t times = use.find("gradient ring") != std::string::npos ? 2 : 1;
      EXPECT_EQ(elements, times * 2 * 2 * 32 * 8) << where << " " << use;
    }
  });
}

TEST(ContextAttention, AKernelRunAgainForRoomDoesNotExchangeAgain) {
  run_again_for_room(ContextExchange::kAllGather, 3);
  run_again_for_room(ContextExchange::kRing, 3);
}

TEST(ContextAttention, WithoutAGroupItIsAttentionAndABadLengthIsRefused) {
  const AttentionCase c = attention_case(8, 2, 2);
  Interpreter interp;
  const Tensor out = context_attention(interp.input(c.q), interp.input(c.k), interp.input(c.v), true);
  EXPECT_TRUE(at::equal(out.value(), attention(interp.input(c.q), interp.input(c.k), interp.input(c.v), true).value()));
  run_ranks(2, [&](int, ThreadGroup& group) {
    Interpreter local;
    local.set_context_parallel(&group);
    // 3 rows a rank: a sequence of 6, not 2 x 2 chunks
    const at::Tensor odd = at::randn({1, 2, 3, 8});
    EXPECT_THROW(context_attention(local.input(odd), local.input(odd), local.input(odd), true), c10::Error);
  });
}

TEST(ContextAttention, RotaryAnglesFollowThePiecesPositions) {
  at::manual_seed(2);
  const at::Tensor x = at::randn({2, 16, 2, 8});  // (B, T, H, hd)
  Interpreter interp;
  const at::Tensor whole = rope(interp.input(x), 10000.0).value();
  for (int64_t r = 0; r < 4; ++r) {
    const ContextLayout layout{4, r};
    const at::Tensor part = rope(interp.input(layout.part_of(x, 1)), 10000.0, layout.pieces(16)).value();
    EXPECT_TRUE(at::allclose(part, layout.part_of(whole, 1), 1e-6, 1e-6)) << "rank " << r;
  }
  EXPECT_THROW(rope(interp.input(x), 10000.0, std::vector<SequencePiece>{{0, 0, 8}}), c10::Error);  // 8 of 16 rows
}

}  // namespace ht::test::context_parallel_tests

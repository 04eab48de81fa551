// Tensor parallelism's ops against the unsplit computation: ranks are threads of one process
// (parallel/thread_group.h). A column-parallel then row-parallel pair (Megatron's f and g),
// the same with sequence parallelism (all-gathering linear, reduce-scatter), and the
// vocabulary-parallel embedding and cross entropy with a padded vocabulary: equal losses and each
// rank's gradients equal to its slice of the one-rank gradients, within fp32 reduction order.
#include "runtime/interpreter.h"
#include "runtime/ops.h"
#include "parallel/thread_group.h"

#include <gtest/gtest.h>

namespace ht::test {
namespace {

at::Tensor leaf(const at::Tensor& t) { return t.detach().clone().set_requires_grad(true); }

void expect_close(const at::Tensor& actual, const at::Tensor& expected, const std::string& what) {
  EXPECT_TRUE(at::allclose(actual, expected, 1e-5, 1e-6))
      << what << ": max difference " << (actual - expected).abs().max().item<double>();
}

struct MlpCase {
  at::Tensor x, w1, b1, w2, b2, r;  // x (B, T, D), w1 (F, D), w2 (D, F), r (B, T, D) weights the sum
};

MlpCase mlp_case() {
  at::manual_seed(3);
  return {at::randn({2, 8, 6}), at::randn({12, 6}), at::randn({12}), at::randn({6, 12}), at::randn({6}), at::randn({2, 8, 6})};
}

// sum(r * (w2 gelu(w1 x + b1) + b2)) on one rank: the loss and the gradients of x, w1, b1, w2, b2.
std::vector<at::Tensor> one_rank_mlp(const MlpCase& c) {
  Interpreter interp;
  at::Tensor x = leaf(c.x), w1 = leaf(c.w1), b1 = leaf(c.b1), w2 = leaf(c.w2), b2 = leaf(c.b2);
  const Tensor xi = interp.param(x);
  const Tensor y = linear(gelu(linear(xi, interp.param(w1), interp.param(b1))), interp.param(w2), interp.param(b2));
  const Tensor loss = sum(mul(y, interp.input(c.r)));
  interp.backward(loss);
  return {loss.value(), x.grad(), w1.grad(), b1.grad(), w2.grad(), b2.grad()};
}

// The same, split over `t` ranks: w1 by rows, w2 by columns; with sequence parallelism x enters
// and y leaves in pieces of the sequence (dimension 1).
void split_mlp(int t, bool sequence_parallel) {
  const MlpCase c = mlp_case();
  const std::vector<at::Tensor> expected = one_rank_mlp(c);
  run_ranks(t, [&](int rank, ThreadGroup& group) {
    Interpreter interp;
    interp.set_tensor_parallel(&group);
    const int64_t f = c.w1.size(0) / t, s = c.x.size(1) / t;
    at::Tensor x = leaf(sequence_parallel ? c.x.narrow(1, rank * s, s) : c.x);
    at::Tensor w1 = leaf(c.w1.narrow(0, rank * f, f)), b1 = leaf(c.b1.narrow(0, rank * f, f));
    at::Tensor w2 = leaf(c.w2.narrow(1, rank * f, f)), b2 = leaf(c.b2);
    const Tensor xi = interp.param(x);
    const Tensor hidden = sequence_parallel ? tp_gather_linear(xi, 1, interp.param(w1), interp.param(b1))
                                            : linear(tp_copy(xi), interp.param(w1), interp.param(b1));
    const Tensor partial = linear(gelu(hidden), interp.param(w2));
    const Tensor y = sequence_parallel ? add(tp_reduce_scatter(partial, 1), tp_copy(interp.param(b2)))
                                       : add(tp_reduce(partial), interp.param(b2));
    const at::Tensor r = sequence_parallel ? c.r.narrow(1, rank * s, s) : c.r;
    Tensor loss = sum(mul(y, interp.input(r)));
    if (sequence_parallel) loss = tp_reduce(loss);  // each rank holds part of the sum
    interp.backward(loss);
    const std::string where = "rank " + std::to_string(rank) + (sequence_parallel ? " (SP)" : "");
    expect_close(loss.value(), expected[0], where + " loss");
    expect_close(x.grad(), sequence_parallel ? expected[1].narrow(1, rank * s, s) : expected[1], where + " x");
    expect_close(w1.grad(), expected[2].narrow(0, rank * f, f), where + " w1");
    expect_close(b1.grad(), expected[3].narrow(0, rank * f, f), where + " b1");
    expect_close(w2.grad(), expected[4].narrow(1, rank * f, f), where + " w2");
    expect_close(b2.grad(), expected[5], where + " b2");
  });
}

TEST(TensorParallelOps, ColumnThenRowParallelIsTheWholeLayer) {
  split_mlp(2, false);
  split_mlp(4, false);
}

TEST(TensorParallelOps, SequenceParallelPiecesAreTheWholeLayer) {
  split_mlp(2, true);
  split_mlp(4, true);
}

// Embedding then cross entropy over a vocabulary of 7, padded to a multiple of t.
void vocabulary(int t) {
  at::manual_seed(5);
  const int64_t v = 7, d = 4, padded = (v + t - 1) / t * t, rows = padded / t;
  const at::Tensor table = at::randn({v, d}), head = at::randn({v, d});
  const at::Tensor tokens = at::randint(0, v, {3, 5}, at::kLong), target = at::randint(0, v, {15}, at::kLong);
  at::Tensor e1 = leaf(table), h1 = leaf(head);
  Interpreter one;
  const Tensor loss1 = cross_entropy(
      linear(reshape(embedding(one.param(e1), one.input(tokens)), {15, d}), one.param(h1)), one.input(target));
  one.backward(loss1);
  auto rows_of = [&](const at::Tensor& whole, int rank) {  // rank's rows, zero padded
    at::Tensor part = at::zeros({rows, d});
    const int64_t first = rank * rows, n = std::max<int64_t>(0, std::min(v, first + rows) - first);
    if (n > 0) part.narrow(0, 0, n).copy_(whole.narrow(0, first, n));
    return part;
  };
  run_ranks(t, [&](int rank, ThreadGroup& group) {
    Interpreter interp;
    interp.set_tensor_parallel(&group);
    const int64_t first = rank * rows, valid = std::max<int64_t>(0, std::min(v, first + rows) - first);
    at::Tensor e = leaf(rows_of(table, rank)), h = leaf(rows_of(head, rank));
    const Tensor x = tp_reduce(vocab_parallel_embedding(interp.param(e), interp.input(tokens), first));
    const Tensor logits = linear(tp_copy(reshape(x, {15, d})), interp.param(h));
    const Tensor loss = vocab_parallel_cross_entropy(logits, interp.input(target), first, valid);
    interp.backward(loss);
    const std::string where = "t " + std::to_string(t) + " rank " + std::to_string(rank);
    expect_close(loss.value(), loss1.value(), where + " loss");
    expect_close(e.grad(), rows_of(e1.grad(), rank), where + " embedding");
    expect_close(h.grad(), rows_of(h1.grad(), rank), where + " head");
  });
}

TEST(TensorParallelOps, VocabularyParallelEmbeddingAndCrossEntropyAreTheWholeOnes) {
  vocabulary(2);
  vocabulary(4);  // 7 tokens in 4 x 2 rows: the last rank holds one token and one padding row
}

TEST(TensorParallelOps, ExchangingOpsAreCollectivesAndNeedAGroup) {
  Interpreter interp;
  const Tensor x = interp.input(at::ones({2, 2}));
  EXPECT_THROW(tp_reduce(x), c10::Error);  // no group set
  run_ranks(2, [&](int, ThreadGroup& group) {
    Interpreter local;
    local.set_tensor_parallel(&group);
    const Tensor y = local.input(at::ones({2, 4}));
    EXPECT_TRUE(tp_reduce(y).info()->producer->op->traits().collective);
    EXPECT_TRUE(tp_reduce_scatter(y, 1).info()->producer->op->traits().collective);
    EXPECT_FALSE(tp_copy(y).info()->producer->op->traits().collective);  // no exchange forward
  });
}

TEST(TensorParallelOps, ASeedStreamDrawsOtherMasksFromTheSameCounter) {
  Interpreter a, b;
  const uint64_t plain = a.next_seed();
  uint64_t streamed = 0;
  {
    SeedStream stream(b, 2);
    streamed = b.next_seed();
  }
  EXPECT_NE(plain, streamed);
  EXPECT_EQ(a.seed_counter(), b.seed_counter());
  EXPECT_EQ(a.next_seed(), b.next_seed());  // back on stream 0
}

}  // namespace
}  // namespace ht::test

// attention: output and q, k, v gradients equal libtorch autograd of the naive composition
// (float64 tightly, fp32, bf16) across query-block edges, grouped-query ratios, causal masks and
// T != S; what the op leaves the interpreter holding is O(T), never T x T; dropout draws its masks
// from the seed stream and replays them bit for bit in a regeneration and in backward.
#include "base/compat.h"
#include "memory/memory_manager.h"
#include "runtime/determinism.h"
#include "tests/support/cpu_features.h"
#include "tests/support/op_check.h"

#include <c10/util/accumulate.h>
#if defined(HT_FUSED_ATTENTION) && defined(HT_TORCH_CUDA)
#include <ATen/cuda/CUDAContext.h>
#endif

#include <cmath>
#include <limits>
#include <string>

namespace ht::test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Shape {
  int64_t B, H, Hkv, T, S, hd;
  bool causal;
  std::string str() const {
    return "B " + std::to_string(B) + " H " + std::to_string(H) + " Hkv " + std::to_string(Hkv) + " T " +
           std::to_string(T) + " S " + std::to_string(S) + " hd " + std::to_string(hd) +
           (causal ? " causal" : "");
  }
};

// softmax(q k^T * scale, -inf above the diagonal if causal) v, k and v repeated for each query
// head of their group; `keep` (B, H, T, S), when given, is dropout's mask of probability p.
at::Tensor naive_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                           double scale, const at::Tensor& keep = {}, double p = 0) {
  const int64_t groups = q.size(1) / k.size(1);
  const at::Tensor ke = k.repeat_interleave(groups, 1), ve = v.repeat_interleave(groups, 1);
  at::Tensor s = at::matmul(q, ke.transpose(-2, -1)) * scale;
  if (causal) {
    s = s.masked_fill(at::ones({q.size(2), k.size(2)}, q.options().dtype(at::kBool)).triu(1), -kInf);
  }
  at::Tensor probs = at::softmax(s, -1);
  if (keep.defined()) probs = probs * keep / (1 - p);
  return at::matmul(probs, ve);
}

std::vector<at::Tensor> qkv(const Shape& sh, at::ScalarType dtype = at::kDouble) {
  const auto opts = at::TensorOptions().dtype(dtype);
  return {at::randn({sh.B, sh.H, sh.T, sh.hd}, opts), at::randn({sh.B, sh.Hkv, sh.S, sh.hd}, opts),
          at::randn({sh.B, sh.Hkv, sh.S, sh.hd}, opts)};
}

double default_scale(const Shape& sh) { return 1.0 / std::sqrt(static_cast<double>(sh.hd)); }

TEST(OpsAttention, MatchesNaiveAttentionAcrossBlockEdgesAndHeadGroups) {
  at::manual_seed(0);
  const std::vector<Shape> shapes{
      {1, 1, 1, 1, 1, 8, false},     {1, 1, 1, 1, 1, 8, true},      {2, 4, 4, 7, 7, 8, true},
      {2, 4, 2, 7, 11, 8, false},    {1, 4, 4, 64, 64, 16, true},   {2, 4, 1, 64, 40, 16, false},
      {1, 8, 2, 130, 130, 8, true},  {1, 4, 4, 130, 200, 8, false}, {1, 4, 2, 257, 257, 8, true},
      {1, 4, 1, 257, 257, 8, false}, {1, 2, 2, 257, 129, 4, false}, {1, 4, 1, 257, 257, 8, true}};
  for (const Shape& sh : shapes) {
    SCOPED_TRACE(sh.str());
    check_op(
        {qkv(sh), [&](auto&, auto& t) { return one(attention(t[0], t[1], t[2], sh.causal)); },
         [&](auto& t) { return one(naive_attention(t[0], t[1], t[2], sh.causal, default_scale(sh))); }});
  }
}

TEST(OpsAttention, TakesAGivenScale) {
  at::manual_seed(1);
  const Shape sh{2, 2, 1, 9, 9, 8, true};
  check_op({qkv(sh),
            [](auto&, auto& t) { return one(attention(t[0], t[1], t[2], true, 0.0, true, 0.7)); },
            [](auto& t) { return one(naive_attention(t[0], t[1], t[2], true, 0.7)); }});
}

// As a transformer calls it: heads split out of (B, T, H, hd) by a transpose, so q, k and v
// arrive strided.
TEST(OpsAttention, TakesTransposedInputs) {
  at::manual_seed(10);
  const auto rows = [](int64_t heads) { return at::randn({2, 150, heads, 8}, at::kDouble); };
  const double scale = 1 / std::sqrt(8.0);
  check_op({{rows(4), rows(2), rows(2)},
            [](auto&, auto& t) {
              return one(attention(transpose(t[0], 1, 2), transpose(t[1], 1, 2), transpose(t[2], 1, 2), true));
            },
            [&](auto& t) {
              return one(naive_attention(t[0].transpose(1, 2), t[1].transpose(1, 2), t[2].transpose(1, 2),
                                         true, scale));
            }});
}

TEST(OpsAttention, MatchesInFloat32) {
  at::manual_seed(2);
  for (const Shape& sh : {Shape{2, 4, 2, 150, 150, 16, true}, Shape{1, 4, 4, 33, 140, 16, false}}) {
    SCOPED_TRACE(sh.str());
    OpCheck check{
        qkv(sh, at::kFloat), [&](auto&, auto& t) { return one(attention(t[0], t[1], t[2], sh.causal)); },
        [&](auto& t) { return one(naive_attention(t[0], t[1], t[2], sh.causal, default_scale(sh))); }};
    check.rtol = 2e-5;
    check.atol = 1e-6;
    check_op(check);
  }
}

// bf16 in and out, fp32 inside: against fp32 autograd on the same (bf16-rounded) values.
TEST(OpsAttention, MatchesInBfloat16WithFloat32Inside) {
  if (!cpu_has_avx512_core()) GTEST_SKIP() << kWithoutAvx512;  // the tolerances are oneDNN's fp32 accumulation
  at::manual_seed(3);
  const Shape sh{2, 4, 2, 140, 140, 16, true};
  std::vector<at::Tensor> low = qkv(sh, at::kBFloat16), ref;
  for (at::Tensor& t : low) {
    ref.push_back(t.to(at::kFloat).requires_grad_(true));
    t.requires_grad_(true);
  }
  const at::Tensor upstream = at::randn({sh.B, sh.H, sh.T, sh.hd});
  const at::Tensor expected = naive_attention(ref[0], ref[1], ref[2], true, default_scale(sh));
  expected.backward(upstream);
  Interpreter interp;
  Tensor y = attention(interp.param(low[0]), interp.param(low[1]), interp.param(low[2]), true);
  EXPECT_EQ(y.dtype(), at::kBFloat16);
  EXPECT_TRUE(all_close(y.value(), expected, 1e-2, 1e-2)) << "output";
  interp.backward({y}, {upstream.to(at::kBFloat16)});
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(low[i].grad().dtype(), at::kBFloat16);
    EXPECT_TRUE(all_close(low[i].grad(), ref[i].grad(), 2e-2, 1e-2)) << "gradient of input " << i;
  }
}

TEST(OpsAttention, RunsInLowPrecisionUnderAutocast) {
  at::manual_seed(4);
  const Shape sh{1, 2, 2, 20, 20, 8, true};
  const std::vector<at::Tensor> t = qkv(sh, at::kFloat);
  Interpreter interp;
  interp.set_autocast(at::kBFloat16);
  const auto param = [&](const at::Tensor& x) { return interp.param(x.clone().requires_grad_(true)); };
  Tensor y = attention(param(t[0]), param(t[1]), param(t[2]), true);
  EXPECT_EQ(y.dtype(), at::kBFloat16);
  const TensorInfo* lse = y.info()->producer->outputs[1];  // held by the tape
  ASSERT_NE(lse, nullptr);
  EXPECT_EQ(lse->dtype, at::kFloat) << "the log-sum-exp stays fp32";
  EXPECT_TRUE(
      all_close(y.value(), naive_attention(t[0], t[1], t[2], true, default_scale(sh)), 2e-2, 1e-2));
}

int64_t numel(const TensorInfo& t) { return c10::multiply_integers(t.sizes); }

// The point of the op: after forward the interpreter holds the output and the log-sum-exp,
// O(T), where the composed attention holds its T x T probabilities.
TEST(OpsAttention, HoldsNoTByTTensorForBackward) {
  const int64_t B = 1, H = 2, T = 512, hd = 16;
  at::manual_seed(5);
  MemoryManager memory;
  Interpreter interp{{}, &memory};
  const auto weight = [](std::vector<int64_t> s) { return at::randn(s).requires_grad_(true); };
  Tensor q = interp.param(weight({B, H, T, hd})), k = interp.param(weight({B, H, T, hd}));
  Tensor v = interp.param(weight({B, H, T, hd}));
  memory.reset_peak();
  Tensor y = attention(q, k, v, true);
  const ComputePath& path = *y.info()->producer;
  ASSERT_EQ(path.outputs.size(), 2u) << "the output and the log-sum-exp";
  EXPECT_EQ(std::vector<int64_t>(path.outputs[1]->sizes.begin(), path.outputs[1]->sizes.end()),
            (std::vector<int64_t>{B, H, T}));
  for (const TensorInfo* out : path.outputs) EXPECT_LT(numel(*out), T * T);
  const int64_t held = 4 * (B * H * T * hd + B * H * T);
  EXPECT_EQ(memory.stats().resident_bytes, held) << "q, k and v are leaves: only out and lse count";
  EXPECT_EQ(memory.stats().peak_resident_bytes, held);
  interp.backward({y}, {at::ones({B, H, T, hd})});
  EXPECT_EQ(interp.tape().size(), 0u);

  // For contrast, the composition through the same interpreter.
  Tensor mask = interp.input(at::ones({T, T}, at::kBool).triu(1));
  Tensor s = masked_fill(mul(matmul(q, transpose(k, -2, -1)), 0.25), mask, -kInf);
  Tensor composed = matmul(softmax(s, -1), v);
  s.reset();
  EXPECT_GE(memory.stats().resident_bytes, 4 * B * H * T * T) << "softmax's output, saved";
}

TEST(OpsAttention, DropoutMatchesNaiveAttentionWithTheSameMasks) {
  at::manual_seed(6);
  const double p = 0.3;
  const uint64_t interp_seed = 17;
  const uint64_t op_seed =
      Interpreter(InterpreterOptions{ExecutionMode::kInterpreted, interp_seed}).next_seed();
  for (const Shape& sh : {Shape{1, 4, 2, 130, 130, 8, true}, Shape{2, 2, 1, 7, 11, 8, false}}) {
    SCOPED_TRACE(sh.str());
    OpCheck check{qkv(sh),
                  [&](auto&, auto& t) { return one(attention(t[0], t[1], t[2], sh.causal, p)); },
                  [&](auto& t) {
                    const at::Tensor keep = detail::attention_dropout_mask(
                        t[0].sizes(), t[1].sizes(), sh.causal, p, op_seed, t[0].device());
                    return one(naive_attention(t[0], t[1], t[2], sh.causal, default_scale(sh), keep, p));
                  }};
    check.seed = interp_seed;
    check_op(check);
  }
}

TEST(OpsAttention, DropoutKeepsAboutOneMinusPAndScales) {
  // q = 0: every probability is 1/S, so with v = 1 each output is (kept keys / S) / (1 - p).
  const double p = 0.25;
  const int64_t S = 256;
  Interpreter interp(InterpreterOptions{ExecutionMode::kInterpreted, 3});
  Tensor y = attention(interp.input(at::zeros({2, 4, 300, 8})), interp.input(at::randn({2, 2, S, 8})),
                       interp.input(at::ones({2, 2, S, 8})), false, p);
  EXPECT_NEAR(y.value().mean().item<double>(), 1.0, 0.01);
  const at::Tensor keep =
      detail::attention_dropout_mask({2, 4, 300, 8}, {2, 2, S, 8}, false, p, 0, at::kCPU);
  EXPECT_NEAR(keep.to(at::kDouble).mean().item<double>(), 1 - p, 0.01);
  EXPECT_EQ(interp.seed_counter(), 1u);
  EXPECT_TRUE(y.info()->producer->op->traits().random);
}

TEST(OpsAttention, DropoutIsTheSameForTheSameSeedAndAbsentInEvaluation) {
  at::manual_seed(7);
  const std::vector<at::Tensor> t = qkv({1, 2, 2, 40, 40, 8, true}, at::kFloat);
  const auto run = [&](uint64_t seed, double p, bool training) {
    Interpreter interp(InterpreterOptions{ExecutionMode::kInterpreted, seed});
    Tensor y = attention(interp.input(t[0]), interp.input(t[1]), interp.input(t[2]), true, p, training);
    EXPECT_EQ(interp.seed_counter(), p > 0 && training ? 1u : 0u);
    EXPECT_EQ(y.info()->producer->op->traits().random, p > 0 && training);
    return y.value().clone();
  };
  EXPECT_TRUE(run(5, 0.5, true).equal(run(5, 0.5, true)));
  EXPECT_FALSE(run(5, 0.5, true).equal(run(6, 0.5, true)));
  EXPECT_TRUE(run(5, 0.5, false).equal(run(5, 0.0, true)));
}

// ExecutionMode::kAutograd records the op's forward with libtorch's autograd: the same bits
// forward (dropout included), and gradients from differentiating the blockwise kernel.
TEST(OpsAttention, AutogradModeComputesTheSameForward) {
  at::manual_seed(8);
  for (const Shape& sh : {Shape{1, 4, 2, 140, 140, 8, true}, Shape{1, 2, 1, 140, 70, 8, false}}) {
    SCOPED_TRACE(sh.str());
    const std::vector<at::Tensor> t = qkv(sh);
    const at::Tensor upstream = at::randn({sh.B, sh.H, sh.T, sh.hd}, at::kDouble);
    std::vector<std::vector<at::Tensor>> results;
    for (ExecutionMode mode : {ExecutionMode::kInterpreted, ExecutionMode::kAutograd}) {
      Interpreter interp(InterpreterOptions{mode, 21});
      std::vector<at::Tensor> leaves;
      for (const at::Tensor& x : t) leaves.push_back(x.clone().requires_grad_(true));
      Tensor y = attention(interp.param(leaves[0]), interp.param(leaves[1]), interp.param(leaves[2]),
                           sh.causal, 0.2);
      results.push_back({y.value().detach().clone()});
      interp.backward({y}, {upstream});
      for (const at::Tensor& x : leaves) results.back().push_back(x.grad());
    }
    EXPECT_TRUE(results[0][0].equal(results[1][0])) << "forward";
    for (int i = 1; i <= 3; ++i) EXPECT_TRUE(all_close(results[0][i], results[1][i])) << "gradient " << i;
  }
}

// A regeneration replays the kernel bit for bit, dropout masks included; gradients after every
// activation was dropped equal those with nothing dropped.
TEST(OpsAttention, RegenerationAndEvictionGiveIdenticalBits) {
  at::manual_seed(9);
  const Shape sh{2, 4, 2, 150, 150, 8, true};
  const std::vector<at::Tensor> t = qkv(sh, at::kFloat);
  const at::Tensor c = at::randn({sh.B, sh.H, sh.T, sh.hd});
  const auto run = [&](bool drop_everything) {
    MemoryManager memory;
    Interpreter interp(InterpreterOptions{ExecutionMode::kInterpreted, 5}, &memory);
    std::vector<at::Tensor> leaves;
    for (const at::Tensor& x : t) leaves.push_back(x.clone().requires_grad_(true));
    Tensor h =
        attention(interp.param(leaves[0]), interp.param(leaves[1]), interp.param(leaves[2]), true, 0.1);
    const at::Tensor out = h.value().clone();
    const uint64_t seeds = interp.seed_counter();
    interp.evict(*h.info());
    EXPECT_TRUE(h.value().equal(out)) << "regenerated output";
    EXPECT_EQ(interp.seed_counter(), seeds) << "a recomputation draws no seed";
    Tensor loss = sum(mul(h, interp.input(c)));
    h.reset();
    if (drop_everything) {
      EXPECT_GT(memory.evict_all(), 0);
    }
    interp.backward(loss);
    std::vector<at::Tensor> grads{out};
    for (const at::Tensor& x : leaves) grads.push_back(x.grad());
    return std::make_pair(grads, memory.stats().recomputations);
  };
  auto [kept, recomputed_kept] = run(false);
  auto [dropped, recomputed_dropped] = run(true);
  EXPECT_GT(recomputed_dropped, recomputed_kept);
  for (size_t i = 0; i < kept.size(); ++i) EXPECT_TRUE(kept[i].equal(dropped[i])) << "tensor " << i;
}

TEST(OpsAttention, RefusesWhatItCannotCompute) {
  Interpreter interp;
  Tensor q = interp.input(at::randn({1, 3, 4, 8})), k = interp.input(at::randn({1, 2, 4, 8}));
  EXPECT_THROW(attention(q, k, k, false), c10::Error) << "3 query heads over 2 key heads";
  Tensor q2 = interp.input(at::randn({1, 2, 4, 8})), k5 = interp.input(at::randn({1, 2, 5, 8}));
  EXPECT_THROW(attention(q2, k5, k5, true), c10::Error) << "causal with T != S";
  EXPECT_NO_THROW(attention(q2, k5, k5, false));
  EXPECT_THROW(attention(q2, k, k, false, 1.0), c10::Error) << "dropout_p = 1";
  EXPECT_THROW(attention(q2, interp.input(at::randn({1, 2, 4, 4})), k, false), c10::Error) << "hd";
}


// On a GPU the op takes ATen's fused memory-efficient kernel, whose backward adds the parts of
// split keys with atomics unless determinism is strict (base/compat.h makes it so for that call):
// GPT-2's heads at T = 1024, twice, the same gradient bits.
TEST(OpsAttention, FusedBackwardOnAGpuRepeatsItsBits) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no GPU here";
#ifndef HT_FUSED_ATTENTION
  GTEST_SKIP() << "this libtorch has no fused attention (base/compat.h)";
#endif
  use_deterministic_cuda_kernels();  // as hybrid_train does on a GPU: warn_only for other ops
  at::manual_seed(9);
  const auto cuda = at::TensorOptions().device(at::kCUDA, 0).dtype(at::kBFloat16);
  const std::vector<int64_t> shape{4, 12, 1024, 64};
  const at::Tensor q = at::randn(shape, cuda), k = at::randn(shape, cuda), v = at::randn(shape, cuda);
  const at::Tensor upstream = at::randn(shape, cuda);
  const int64_t fused_before = detail::attention_kernel_counts().fused;
  auto gradients = [&] {
    std::vector<at::Tensor> leaves{q.clone().requires_grad_(true), k.clone().requires_grad_(true),
                                   v.clone().requires_grad_(true)};
    Interpreter interp;
    Tensor y = attention(interp.param(leaves[0]), interp.param(leaves[1]), interp.param(leaves[2]), true);
    interp.backward({y}, {upstream});
    return std::vector<at::Tensor>{leaves[0].grad(), leaves[1].grad(), leaves[2].grad()};
  };
  const std::vector<at::Tensor> first = gradients(), second = gradients();
  EXPECT_EQ(detail::attention_kernel_counts().fused, fused_before + 2) << "the fused kernel ran";
  EXPECT_TRUE(at::globalContext().deterministicAlgorithmsWarnOnly()) << "strict for that call only";
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(first[i].equal(second[i])) << "gradient of input " << i;
}

// The decoder's heads are strided views of one (B, T, 3 H hd) projection (models/decoder.cpp):
// on a GPU of compute capability 8.0 or newer they take ATen's flash kernel (not the blockwise
// one, 6x slower in GPT-2 small's plan on an H200 at b91dab8), its backward repeats its bits,
// and its gradients are autograd's through PyTorch's own attention to bf16's rounding.
TEST(OpsAttention, TheDecodersStridedHeadsTakeFlashOnAGpu) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no GPU here";
#if !defined(HT_FUSED_ATTENTION) || !defined(HT_TORCH_CUDA)
  GTEST_SKIP() << "this libtorch has no fused attention (base/compat.h)";
#else
  use_deterministic_cuda_kernels();
  at::manual_seed(10);
  const int64_t b = 2, t = 256, h = 4, hd = 64;
  const auto cuda = at::TensorOptions().device(at::kCUDA, 0).dtype(at::kBFloat16);
  const at::Tensor qkv = at::randn({b, t, 3 * h * hd}, cuda), upstream = at::randn({b, h, t, hd}, cuda);
  const detail::AttentionKernelCounts before = detail::attention_kernel_counts();
  auto gradient = [&] {
    const at::Tensor leaf = qkv.clone().requires_grad_(true);
    Interpreter interp;
    const Tensor x = interp.param(leaf);
    auto heads = [&](int64_t from) {
      return transpose(reshape(slice(x, 2, from * hd, (from + h) * hd), {b, t, h, hd}), 1, 2);
    };
    const Tensor y = attention(heads(0), heads(h), heads(2 * h), /*causal=*/true);
    interp.backward({y}, {upstream});
    return leaf.grad();
  };
  const at::Tensor first = gradient(), second = gradient();
  const detail::AttentionKernelCounts after = detail::attention_kernel_counts();
  EXPECT_EQ(after.fused - before.fused, 2) << "a fused kernel ran";
  if (at::cuda::getDeviceProperties(0)->major >= 8) EXPECT_EQ(after.flash - before.flash, 2) << "flash ran";
  EXPECT_TRUE(first.equal(second)) << "the same gradient bits twice";
  const at::Tensor leaf = qkv.clone().requires_grad_(true);
  auto heads = [&](int64_t from) {
    return leaf.narrow(2, from * hd, h * hd).reshape({b, t, h, hd}).transpose(1, 2);
  };
  at::scaled_dot_product_attention(heads(0), heads(h), heads(2 * h), {}, 0.0, true).backward(upstream);
  const at::Tensor expected = leaf.grad().to(at::kFloat);
  const double scale = expected.abs().max().item<double>();
  EXPECT_LT((first.to(at::kFloat) - expected).abs().max().item<double>(), 0.02 * scale)
      << "autograd's gradient through PyTorch's attention, to bf16's rounding";
#endif
}

}  // namespace
}  // namespace ht::test

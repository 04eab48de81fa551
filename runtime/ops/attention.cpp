// Attention as one op that never stores the T x S scores (issue 30). Composed from matmul,
// softmax and masked_fill, attention saves its (B, H, T, S) probabilities for backward: at
// GPT-2's T = 1024 they outweigh every other activation of a block, and DTR can only drop and
// recompute them whole. As one op, forward and backward are each one kernel over ATen calls:
// forward returns the output and, hidden, the log-sum-exp of each query row (B, H, T); backward
// recomputes the probabilities from q, k and that log-sum-exp, one block of queries at a time
// (FlashAttention-2's backward, with D = rowsum(dO * O)). What the tape holds is q, k, v, the
// output and the log-sum-exp: O(T), never T x S.
//
// Two kernels, chosen from the inputs alone (so forward, a recomputation and backward agree):
// - blockwise (every device, every libtorch): queries in blocks of 32-128 rows
//   (AttentionDims::block_rows), each block's scores (B, Hkv, G * rows, keys) from a GEMM in the
//   inputs' type (bf16 on bf16 units, as the composed attention's GEMMs run), softmaxed in fp32
//   (double for double inputs), and dropped before the next block; dK and dV are summed over the
//   blocks in fp32. Causal masking is done inside each block (a block's keys
//   stop at its last query, so key blocks above the diagonal are never computed). Grouped-query
//   attention folds a key head's G query heads into the rows, so K and V are never repeated.
// - fused (libtorch >= 2.1 on CUDA, base/compat.h): where ATen would pick a fused kernel, with no
//   dropout and H == Hkv: ATen's flash attention for 16-bit inputs on sm80 and newer (1.5-1.8x
//   the memory-efficient kernel's speed on an H200), its memory-efficient attention elsewhere.
//
// Dropout (blockwise only): the keep-mask of block b comes from a private generator seeded with
// seed + b, the seed drawn from the interpreter's stream when the op is applied (as
// runtime/ops/dropout.cpp does), so a recomputation and backward redraw the same masks bit for bit.
#include "base/compat.h"
#include "runtime/ops/attention_kernels.h"
#include "runtime/ops/op_util.h"

#if defined(HT_FUSED_ATTENTION) && defined(HT_TORCH_CUDA)
#include <ATen/cuda/CUDAContext.h>
#endif

#include <algorithm>
#include <atomic>
#include <array>
#include <cmath>
#include <limits>

namespace ht {
namespace detail {

// Queries per block: as many as make 1 MiB of a block's scores (B * H * rows * S floats, the
// largest temporary; backward holds about four such), at least 32 and at most 128. From the
// shapes and the kind of device alone, never from the budget: the dropout masks are drawn per
// block, so the blocks must be the same in every run on one kind of device. (A fixed 128 rows made the 6-layer GPT's backward at
// B = 8, H = 8, S = 128 hold 4 MiB blocks, the floor of its budget at 0.2 of its activations.)
// On a GPU the blocks are sized by 64 MiB of scores: each block is a dozen kernel launches, and at
// GPT-2 small's B 8, T 1024 the 1 MiB rule gave 32 rows, whose four times the launches took the
// fp32 step with dropout from 250 ms (128 rows) to 781 on an H200 (docs/gpu.md, 2026-12-04); a
// GPU's memory holds its 48 MiB blocks. (Not yet run on a GPU at this size; the device and the
// shapes still fix the blocks, so every run on one device draws the same masks. A trace for a GPU
// on meta tensors keeps the CPU's blocks: where a GPU runs flash (16 bits, no dropout) it makes no
// score blocks at all, which the trace does not model either.)
constexpr int64_t kBlockScoreBytes = int64_t{1} << 20, kGpuBlockScoreBytes = int64_t{64} << 20;
constexpr int64_t kMinBlockRows = 32, kMaxBlockRows = 128;

int64_t AttentionDims::block_rows() const {
  const int64_t row_bytes = std::max<int64_t>(1, B * H * S * 4);
  return std::clamp((gpu ? kGpuBlockScoreBytes : kBlockScoreBytes) / row_bytes, kMinBlockRows, kMaxBlockRows);
}

// The query blocks, in row order: each piece of the queries in blocks of d.block_rows(). Block j
// of the piece at position p draws its dropout mask with seed + p x 2^20 + j: one piece at
// position 0 (every run without context parallelism) draws block j's with seed + j, and the
// ranks of a context group, whose pieces start at other positions, draw other masks.
std::vector<QueryBlock> query_blocks(const AttentionDims& d, const AttentionConfig& cfg) {
  const std::vector<SequencePiece> pieces = cfg.pieces.empty() ? std::vector<SequencePiece>{{0, 0, d.T}} : cfg.pieces;
  const int64_t rows = d.block_rows();
  std::vector<QueryBlock> blocks;
  for (const SequencePiece& piece : pieces) {
    for (int64_t j = 0, r = 0; r < piece.length; ++j, r += rows) {
      const int64_t n = std::min(rows, piece.length - r), position = piece.position + r;
      // causal: no key past the block's last query
      blocks.push_back({(piece.position << 20) + j, piece.row + r, n, position, cfg.causal ? position + n : d.S});
    }
  }
  return blocks;
}

// fp32 for fp32, bf16 and fp16 inputs; double stays double (the gradient checks).
at::ScalarType accumulate_type(const at::Tensor& q) {
  return q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// Rows [t0, t0 + n) of x (B, H, T, e) in the accumulate type, folded per key head:
// (B, Hkv, G * n, e), row g * n + r being head g's query t0 + r. Times `scale` if given.
at::Tensor block_rows(const at::Tensor& x, const QueryBlock& blk, const AttentionDims& d, at::ScalarType acc,
                      double scale) {
  at::Tensor rows = x.view({d.B, d.Hkv, d.G, d.T, x.size(3)}).narrow(3, blk.t0, blk.n).to(acc);
  if (scale != 1) rows = rows.mul(scale);  // a new tensor, laid out as x (x may be transposed)
  return rows.reshape({d.B, d.Hkv, d.G * blk.n, x.size(3)});  // copies unless laid out in rows
}

// Scores of one block, (B, Hkv, G * n, keys): (q * scale) k^T, -inf where a key comes after
// its query. The mask is (G * n, keys) bools, built for this block only.
at::Tensor block_scores(const at::Tensor& q_rows, const at::Tensor& k, const QueryBlock& blk,
                        const AttentionDims& d, bool causal) {
  at::Tensor s = at::matmul(q_rows, k.narrow(2, 0, blk.keys).transpose(-2, -1)).to(accumulate_type(q_rows));
  if (!causal) return s;
  const auto longs = at::TensorOptions().dtype(at::kLong).device(s.device());
  const at::Tensor query = at::arange(blk.position, blk.position + blk.n, longs).repeat({d.G}).unsqueeze(1);
  return s.masked_fill_(at::arange(blk.keys, longs) > query, -std::numeric_limits<double>::infinity());
}

// The dropout mask numbered `index` (QueryBlock::index), (B, Hkv, G * n, keys) bools shaped like
// `scores`: true where kept. Kept as bools, a quarter of the scores' bytes (a factor tensor of 0 and 1 / (1 - p) was as
// large as the scores, and the backward's largest temporary beside them).
at::Tensor keep_mask(const at::Tensor& scores, uint64_t index, const AttentionConfig& cfg) {
  at::Tensor keep = at::empty(scores.sizes(), scores.options().dtype(at::kBool));
  // A meta tensor (a traced step): a shape only, no values to draw.
  if (!keep.is_meta()) keep.bernoulli_(1.0 - cfg.dropout_p, compat::seeded_generator(scores.device(), cfg.seed + index));
  return keep;
}

// x times the dropout factor (0 or 1 / (1 - p)), in place: x * 1 * f or x * 0 * f, the bits of
// x * (0 or f) with f the factor in x's type.
at::Tensor& apply_keep_(at::Tensor& x, const at::Tensor& keep, const AttentionConfig& cfg) {
  return x.mul_(keep).mul_(1.0 / (1.0 - cfg.dropout_p));
}

}  // namespace detail

namespace {

using namespace detail;

using TensorList = std::vector<at::Tensor>;

// Forward of one block: (out (B, Hkv, G * n, hd), log-sum-exp (B, Hkv, G * n)). Out-of-place
// where autograd would need the overwritten value (ExecutionMode::kAutograd records this code).
std::pair<at::Tensor, at::Tensor> forward_block(const at::Tensor& q_rows, const at::Tensor& k,
                                                const at::Tensor& v, const QueryBlock& blk,
                                                const AttentionDims& d, const AttentionConfig& cfg) {
  at::Tensor s = block_scores(q_rows, k, blk, d, cfg.causal);
  const at::Tensor m = s.detach().amax(-1, /*keepdim=*/true);  // out does not depend on it
  const at::Tensor p = s.sub_(m).exp_();  // in place: autograd needs neither s nor s - m
  const at::Tensor l = p.sum(-1, /*keepdim=*/true);
  at::Tensor pv = p;
  if (cfg.dropout_p > 0) {
    pv = p.clone();  // autograd needs p itself
    apply_keep_(pv, keep_mask(p, blk.index, cfg), cfg);
  }
  at::Tensor out = at::matmul(pv.to(v.scalar_type()), v.narrow(2, 0, blk.keys)).to(p.scalar_type()) / l;
  return {out, (m + l.log()).squeeze(-1)};
}

// -> (out (B, H, T, hd) in q's type, lse (B, H, T) in the accumulate type).
TensorList blockwise_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const AttentionConfig& cfg) {
  const AttentionDims d = AttentionDims::of(q.sizes(), k.sizes(), q.device());
  const at::ScalarType acc = accumulate_type(q);
  // GEMMs in the inputs' type (bf16's run on the CPU's bf16 units, as the composed attention's
  // do), softmax and sums in `acc`.
  const at::Tensor kc = k.contiguous(), vc = v.contiguous();
  // The output laid out (B, T, H, hd), as ATen's fused kernels lay theirs: the model's merge of
  // the heads (transpose, then reshape to (B, T, H hd)) is then a view of it, and the output
  // projection saves it without a copy of its own. Each block is written into its rows in q's
  // type as it is made (no concatenation of the blocks first).
  at::Tensor out = at::empty({d.B, d.T, d.H, d.hd}, q.options());
  const at::Tensor by_key_head = out.view({d.B, d.T, d.Hkv, d.G, d.hd}).permute({0, 2, 3, 1, 4});  // (B, Hkv, G, T, hd)
  TensorList lses;
  for (const QueryBlock& blk : query_blocks(d, cfg)) {
    auto [o, lse] = forward_block(block_rows(q, blk, d, q.scalar_type(), cfg.scale), kc, vc, blk, d, cfg);
    by_key_head.narrow(3, blk.t0, blk.n).copy_(o.view({d.B, d.Hkv, d.G, blk.n, d.hd}));
    lses.push_back(lse.view({d.B, d.Hkv, d.G, blk.n}));
  }
  if (lses.empty()) {  // T = 0
    return {out.transpose(1, 2), at::empty({d.B, d.H, 0}, q.options().dtype(acc))};
  }
  return {out.transpose(1, 2), at::cat(lses, 3).view({d.B, d.H, d.T})};
}

// What one block of backward reads and adds to.
struct AttentionBackwardState {
  at::Tensor q, k, v, grad, out, lse;  // as saved: GEMMs run in their type, the rest in fp32
  at::Tensor dk, dv;                   // (B, Hkv, S, hd), accumulated over the blocks
  std::vector<bool> needs;
};

// One block of FlashAttention-2's backward; returns its dq rows (B, Hkv, G, n, hd), undefined
// when q needs no gradient; adds into dk and dv (over the block's keys only).
at::Tensor backward_block(AttentionBackwardState& st, const QueryBlock& blk, const AttentionDims& d,
                          const AttentionConfig& cfg) {
  const at::ScalarType acc = st.dk.scalar_type(), gemm = st.k.scalar_type();
  const at::Tensor q_rows = block_rows(st.q, blk, d, gemm, cfg.scale);
  const at::Tensor g_rows = block_rows(st.grad, blk, d, gemm);
  const at::Tensor lse = block_rows(st.lse.unsqueeze(-1), blk, d, acc);  // (B, Hkv, G * n, 1)
  const at::Tensor s = block_scores(q_rows, st.k, blk, d, cfg.causal);
  const at::Tensor keep = cfg.dropout_p > 0 ? keep_mask(s, blk.index, cfg) : at::Tensor();
  const at::Tensor p = s.sub_(lse).exp_();  // the forward's probabilities, recomputed
  if (st.needs[2]) {
    at::Tensor pv = p;
    if (keep.defined()) apply_keep_(pv = p.clone(), keep, cfg);
    st.dv.narrow(2, 0, blk.keys).add_(at::matmul(pv.to(gemm).transpose(-2, -1), g_rows));
  }
  if (!st.needs[0] && !st.needs[1]) return {};
  // dS = P * (dP - D), dP = dO V^T (times the dropout factor), D = rowsum(dO * O).
  const at::Tensor rowsum = (g_rows.to(acc) * block_rows(st.out, blk, d, acc)).sum(-1, /*keepdim=*/true);
  at::Tensor dp = at::matmul(g_rows, st.v.narrow(2, 0, blk.keys).transpose(-2, -1)).to(acc);
  if (keep.defined()) apply_keep_(dp, keep, cfg);
  const at::Tensor ds = dp.sub_(rowsum).mul_(p);
  const at::Tensor ds_gemm = ds.to(gemm);
  if (st.needs[1]) st.dk.narrow(2, 0, blk.keys).add_(at::matmul(ds_gemm.transpose(-2, -1), q_rows));
  if (!st.needs[0]) return {};
  return at::matmul(ds_gemm, st.k.narrow(2, 0, blk.keys))
      .to(acc)
      .mul_(cfg.scale)
      .view({d.B, d.Hkv, d.G, blk.n, d.hd});
}

// -> (dq, dk, dv), dq in q's type, dk and dv in the accumulate type (fp32 sums over the query
// blocks); undefined where not needed. `keys` and `values` are the ones forward attended to.
TensorList blockwise_backward_sums(const BackwardArgs& a, const at::Tensor& keys, const at::Tensor& values,
                                   const AttentionConfig& cfg) {
  const at::Tensor& q = a.inputs[0];
  const AttentionDims d = AttentionDims::of(q.sizes(), keys.sizes(), q.device());
  const at::ScalarType acc = accumulate_type(q);
  AttentionBackwardState st{q, keys.contiguous(), values.contiguous(),
                            a.grad_outputs[0], a.outputs[0], a.outputs[1], {}, {}, a.needs_input_grad};
  st.dk = at::zeros(st.k.sizes(), st.k.options().dtype(acc));  // sums over blocks in fp32
  st.dv = at::zeros(st.v.sizes(), st.v.options().dtype(acc));
  TensorList dq_blocks;
  for (const QueryBlock& blk : query_blocks(d, cfg)) {
    at::Tensor dq = backward_block(st, blk, d, cfg);
    if (dq.defined()) dq_blocks.push_back(std::move(dq));
  }
  TensorList grads(3);
  if (st.needs[0]) {
    grads[0] = dq_blocks.empty() ? at::zeros_like(q)
                                 : at::cat(dq_blocks, 3).view(q.sizes()).to(q.scalar_type());
  }
  if (st.needs[1]) grads[1] = st.dk;
  if (st.needs[2]) grads[2] = st.dv;
  return grads;
}

// -> (dq, dk, dv) in their inputs' types; undefined where not needed.
TensorList blockwise_backward(const BackwardArgs& a, const AttentionConfig& cfg) {
  TensorList grads = blockwise_backward_sums(a, a.inputs[1], a.inputs[2], cfg);
  for (size_t i : {1, 2}) {
    if (grads[i].defined()) grads[i] = grads[i].to(a.inputs[i].scalar_type());
  }
  return grads;
}

// Outputs (out, lse); backward reads q, k, v, out and lse (lse as the kernel that ran wrote it:
// (B, H, T) from the blockwise one, ATen's layout from the fused one). Counted as attention's
// multiply-adds by the modelled cost (runtime/kernel_cost.cpp), causal ones at half.
std::atomic<int64_t> g_fused_forwards{0}, g_blockwise_forwards{0}, g_flash_forwards{0};

enum class Kernel { kBlockwise, kEfficient, kFlash };

// ATen's flash kernel where it runs (base/compat.h): 16-bit q, k, v with one head count, a head
// size that is a multiple of 8 up to 256, each row contiguous, a GPU of compute capability 8.0 or
// newer. Called only where ATen would fuse (fused_attention_applies), so on a CUDA tensor.
bool flash_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
#if defined(HT_FUSED_ATTENTION) && defined(HT_TORCH_CUDA)
  const at::ScalarType t = q.scalar_type();
  const int64_t hd = q.size(3);
  if ((t != at::kBFloat16 && t != at::kHalf) || hd % 8 != 0 || hd > 256) return false;
  if (q.stride(3) != 1 || k.stride(3) != 1 || v.stride(3) != 1) return false;
  return at::cuda::getDeviceProperties(q.get_device())->major >= 8;
#else
  (void)q, (void)k, (void)v;
  return false;
#endif
}

class AttentionOp final : public Op {
 public:
  explicit AttentionOp(const AttentionConfig& cfg) : Op(traits_for(cfg)), cfg_(cfg) {}

  TensorList forward(const TensorList& in, const ForwardContext&) const override {
    const Kernel kernel = kernel_for(in);
    ++(kernel == Kernel::kBlockwise ? g_blockwise_forwards : g_fused_forwards);
    if (kernel == Kernel::kFlash) {
      ++g_flash_forwards;
      auto [out, lse] = compat::flash_attention_forward(in[0], in[1], in[2], cfg_.causal, cfg_.scale);
      return {out, lse};
    }
    if (kernel == Kernel::kEfficient) {
      auto [out, lse] = compat::fused_attention_forward(in[0], in[1], in[2], cfg_.causal, cfg_.scale);
      return {out, lse};
    }
    return blockwise_forward(in[0], in[1], in[2], cfg_);
  }

  TensorList backward(const BackwardArgs& a) const override {
    if (!a.grad_outputs[0].defined()) return TensorList(3);  // only the hidden lse had one
    const Kernel kernel = kernel_for(a.inputs);
    if (kernel == Kernel::kBlockwise) return blockwise_backward(a, cfg_);
    if (kernel == Kernel::kFlash) {
      auto [dq, dk, dv] = compat::flash_attention_backward(a.grad_outputs[0], a.inputs[0], a.inputs[1], a.inputs[2],
                                                           a.outputs[0], a.outputs[1], cfg_.causal, cfg_.scale);
      TensorList grads{dq, dk, dv};
      for (size_t i = 0; i < 3; ++i) {
        if (!a.needs_input_grad[i]) grads[i] = at::Tensor();
      }
      return grads;
    }
    const std::array<bool, 3> mask{a.needs_input_grad[0], a.needs_input_grad[1], a.needs_input_grad[2]};
    auto [dq, dk, dv] =
        compat::fused_attention_backward(a.grad_outputs[0], a.inputs[0], a.inputs[1], a.inputs[2],
                                         a.outputs[0], a.outputs[1], cfg_.causal, cfg_.scale, mask);
    return {dq, dk, dv};
  }

 private:
  static OpTraits traits_for(const AttentionConfig& cfg) {
    OpTraits t =
        OpTraits::named("attention").saving_inputs({0, 1, 2}).saving_outputs({0, 1}).in_low_precision();
    t.doing(cfg.causal ? Work::kCausalAttention : Work::kAttention);
    if (cfg.dropout_p > 0) t.drawing_random_numbers();
    return t;
  }
  // The same answer in forward and backward: it reads only what both see.
  Kernel kernel_for(const TensorList& in) const {
    if (cfg_.dropout_p != 0 || !compat::fused_attention_applies(in[0], in[1], in[2], cfg_.causal, cfg_.scale)) {
      return Kernel::kBlockwise;
    }
    return flash_applies(in[0], in[1], in[2]) ? Kernel::kFlash : Kernel::kEfficient;
  }
  AttentionConfig cfg_;
};

}  // namespace

namespace detail {

void check_attention_shapes(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                            double dropout_p) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "attention: q, k and v must be (B, H, T, hd), (B, Hkv, S, hd), (B, Hkv, S, hd); got ",
              q.sizes(), ", ", k.sizes(), ", ", v.sizes());
  TORCH_CHECK(k.sizes() == v.sizes(), "attention: k and v must have one shape, got ", k.sizes(), " and ",
              v.sizes());
  TORCH_CHECK(q.size(0) == k.size(0) && q.size(3) == k.size(3),
              "attention: q and k must agree on B and hd, got ", q.sizes(), " and ", k.sizes());
  TORCH_CHECK(k.size(1) > 0 && q.size(1) % k.size(1) == 0,
              "attention: q's heads must be a multiple of k's (grouped-query), got ", q.size(1), " and ",
              k.size(1));
  TORCH_CHECK(k.size(2) > 0, "attention: no keys");
  TORCH_CHECK(!causal || q.size(2) == k.size(2),
              "attention: causal attention needs as many queries as keys, got T = ", q.size(2),
              ", S = ", k.size(2));
  TORCH_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype() && at::isFloatingType(q.dtype()),
              "attention: q, k and v must share one floating type");
  TORCH_CHECK(dropout_p >= 0.0 && dropout_p < 1.0, "attention: dropout_p must be in [0, 1), got ",
              dropout_p);
}

TensorList blockwise_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const AttentionConfig& cfg) {
  return blockwise_forward(q, k, v, cfg);
}

TensorList blockwise_attention_backward_sums(const BackwardArgs& a, const at::Tensor& keys, const at::Tensor& values,
                                             const AttentionConfig& cfg) {
  return blockwise_backward_sums(a, keys, values, cfg);
}

}  // namespace detail

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double dropout_p,
                 bool training, std::optional<double> scale) {
  detail::check_attention_shapes(q, k, v, causal, dropout_p);
  AttentionConfig cfg;
  cfg.causal = causal;
  cfg.dropout_p = training ? dropout_p : 0.0;
  cfg.scale = scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(3))));
  if (cfg.dropout_p > 0) cfg.seed = q.interp().next_seed();
  return detail::apply_first(std::make_shared<AttentionOp>(cfg), {q, k, v});
}

namespace detail {

AttentionKernelCounts attention_kernel_counts() {
  return {g_fused_forwards.load(), g_blockwise_forwards.load(), g_flash_forwards.load()};
}

at::Tensor attention_dropout_mask(at::IntArrayRef q_sizes, at::IntArrayRef k_sizes, bool causal,
                                  double dropout_p, uint64_t seed, const at::Device& device) {
  const AttentionDims d = AttentionDims::of(q_sizes, k_sizes, device);
  AttentionConfig cfg;
  cfg.causal = causal;
  cfg.dropout_p = dropout_p;
  cfg.seed = seed;
  at::Tensor mask =
      at::zeros({d.B, d.Hkv, d.G, d.T, d.S}, at::TensorOptions().dtype(at::kBool).device(device));
  for (const QueryBlock& blk : query_blocks(d, cfg)) {
    const at::Tensor like =
        at::empty({d.B, d.Hkv, d.G * blk.n, blk.keys}, at::TensorOptions().device(device));
    const at::Tensor keep = keep_mask(like, blk.index, cfg).view({d.B, d.Hkv, d.G, blk.n, blk.keys});
    mask.narrow(3, blk.t0, blk.n).narrow(4, 0, blk.keys).copy_(keep);
  }
  return mask.view({d.B, d.H, d.T, d.S});
}

}  // namespace detail
}  // namespace ht

// Context parallelism's attention as a ring (issue 68, Part 2; torchtitan's and Megatron's
// cp_comm_type "p2p"). Each rank of the context group holds its pieces of the sequence
// (runtime/context_parallel.h): its queries, and the keys and values of the same positions. In c
// steps each rank's keys and values go round the group, one rank further a step, so at step s a
// rank holds rank (r - s)'s; while it attends to them it passes them on and receives the next
// (TensorParallelGroup::pass_along_ring), posted before the computation and waited for after it.
// (Whether the pass moves meanwhile is the backend's: MPI progresses a large message only inside
// its calls, and NCCL's sends run on the compute stream; the planner prices them in the open.)
//
// Forward (FlashAttention's contract, per chunk of keys): each query block attends to the pieces
// of the chunk it may see (under causal masking a chunk's piece is wholly before the block, the
// block's own piece, masked inside, or after it and skipped), giving a partial output normalised
// over those keys and its log-sum-exp; the partials merge into the running output by their
// log-sum-exps, O = O e^(L - L') + o e^(l - L') with L' = log(e^L + e^l). Step 0 is the rank's
// own chunk, in which every query sees at least its own key, so no row is ever empty.
// Backward takes the merged output and global log-sum-exp: each chunk's scores are the
// probabilities again (P = e^(S - L)), and the chunk's key and value gradients are summed in fp32
// as they travel: a rank adds its queries' part to the sums it receives for the chunk it holds and
// passes them on behind the keys, so after c steps each rank's sums come home.
//
// What a rank holds beyond the tape, O(T / c) where the gathered variant (context_attention.cpp)
// holds all T: two chunks of keys and values (the one it attends to and the next, arriving; at step
// 0 the first is a packed copy of its own); in backward also three chunk-sized fp32 buffers of
// gradient sums (its queries' part, the total on its way out, the previous rank's arriving). Scores
// are per block of queries against a chunk's piece: (B, Hkv, G x rows, T / 2c), never against the
// whole sequence.
//
// A kernel that finds no room runs again from its start (run_with_room), and the ranks of a group
// do not run out at the same points. The op keeps each call's progress (the step, the query blocks
// merged, the passes under way) until the call ends, and a kernel run again goes on where the last
// run stopped: every rank passes each chunk once, in the same order. Each block's work is made
// before any of it is added in (additions into existing tensors allocate nothing), so a block that
// finds no room has added nothing. Like the gathered variant, its outputs are never recomputed.
#include "runtime/ops/attention_kernels.h"
#include "runtime/ops/op_util.h"

#include <cmath>
#include <limits>

namespace ht {
namespace {

using detail::AttentionConfig;
using detail::AttentionDims;
using detail::QueryBlock;
using TensorList = std::vector<at::Tensor>;

// The keys of a chunk that a block of queries sees: rows [row, row + keys) of the chunk, at
// positions [position, position + keys); `masked` when some of them come after some of its queries.
struct SeenKeys {
  int64_t row, position, keys;
  bool masked;
};

std::vector<SeenKeys> seen_keys(const QueryBlock& blk, const std::vector<SequencePiece>& chunk, bool causal) {
  std::vector<SeenKeys> seen;
  const int64_t last = blk.position + blk.n - 1;  // the block's last query
  for (const SequencePiece& p : chunk) {
    if (!causal) {
      seen.push_back({p.row, p.position, p.length, false});
    } else if (p.position <= last) {
      const int64_t keys = std::min(p.length, last + 1 - p.position);
      seen.push_back({p.row, p.position, keys, p.position + keys - 1 > blk.position});
    }
  }
  return seen;
}

// A block's dropout mask against one piece of keys: numbered by both, so that every (block, piece)
// pair draws its own, and backward draws it again.
uint64_t mask_index(const QueryBlock& blk, const SeenKeys& keys) {
  return static_cast<uint64_t>(blk.index) + static_cast<uint64_t>(keys.position + 1) * 0x9E3779B97F4A7C15ULL;
}

// (G x n, keys) scores of q_rows (B, Hkv, G x n, hd, scaled) against `seen`'s keys of `k`, in the
// accumulate type, -inf where a key comes after its query.
at::Tensor piece_scores(const at::Tensor& q_rows, const at::Tensor& k, const SeenKeys& seen, const QueryBlock& blk,
                        const AttentionDims& d) {
  at::Tensor s = at::matmul(q_rows, k.narrow(2, seen.row, seen.keys).transpose(-2, -1)).to(detail::accumulate_type(q_rows));
  if (!seen.masked) return s;
  const auto longs = at::TensorOptions().dtype(at::kLong).device(s.device());
  const at::Tensor query = at::arange(blk.position, blk.position + blk.n, longs).repeat({d.G}).unsqueeze(1);
  const at::Tensor key = at::arange(seen.position, seen.position + seen.keys, longs);
  return s.masked_fill_(key > query, -std::numeric_limits<double>::infinity());
}

// One block against one chunk: (o (B, Hkv, G x n, hd), normalised over the keys it sees, and their
// log-sum-exp (B, Hkv, G x n)), in the accumulate type. `seen` is not empty.
std::pair<at::Tensor, at::Tensor> chunk_forward(const at::Tensor& q_rows, const at::Tensor& k, const at::Tensor& v,
                                                const std::vector<SeenKeys>& seen, const QueryBlock& blk,
                                                const AttentionDims& d, const AttentionConfig& cfg) {
  std::vector<at::Tensor> scores;
  at::Tensor m;
  for (const SeenKeys& keys : seen) {
    scores.push_back(piece_scores(q_rows, k, keys, blk, d));
    const at::Tensor row_max = scores.back().amax(-1, /*keepdim=*/true);
    m = m.defined() ? at::maximum(m, row_max) : row_max;
  }
  at::Tensor l, o;
  for (size_t i = 0; i < seen.size(); ++i) {
    at::Tensor p = scores[i].sub_(m).exp_();
    const at::Tensor sum = p.sum(-1, /*keepdim=*/true);
    l = l.defined() ? l.add_(sum) : sum;
    if (cfg.dropout_p > 0) detail::apply_keep_(p, detail::keep_mask(p, mask_index(blk, seen[i]), cfg), cfg);
    const at::Tensor pv = at::matmul(p.to(v.scalar_type()), v.narrow(2, seen[i].row, seen[i].keys)).to(p.scalar_type());
    o = o.defined() ? o.add_(pv) : pv;
  }
  return {o.div_(l), (m + l.log()).squeeze(-1)};
}

// One block's gradients against one chunk: dq rows (B, Hkv, G x n, hd), and per piece seen its
// keys' and values' (B, Hkv, keys, hd), all in the accumulate type; undefined where not needed.
struct ChunkGrads {
  at::Tensor dq;
  std::vector<at::Tensor> dk, dv;
};

// q_rows scaled and g_rows in the GEMMs' type; lse and rowsum (B, Hkv, G x n, 1) in the accumulate
// type (rowsum = rowsum(dO * O), FlashAttention-2's D).
ChunkGrads chunk_backward(const at::Tensor& q_rows, const at::Tensor& g_rows, const at::Tensor& lse,
                          const at::Tensor& rowsum, const at::Tensor& k, const at::Tensor& v,
                          const std::vector<SeenKeys>& seen, const QueryBlock& blk, const AttentionDims& d,
                          const AttentionConfig& cfg, const std::vector<bool>& needs) {
  const at::ScalarType gemm = k.scalar_type(), acc = lse.scalar_type();
  ChunkGrads g;
  for (const SeenKeys& keys : seen) {
    const at::Tensor s = piece_scores(q_rows, k, keys, blk, d);
    const at::Tensor keep = cfg.dropout_p > 0 ? detail::keep_mask(s, mask_index(blk, keys), cfg) : at::Tensor();
    const at::Tensor p = s.sub_(lse).exp_();  // the forward's probabilities, over the whole sequence
    const at::Tensor k_piece = k.narrow(2, keys.row, keys.keys), v_piece = v.narrow(2, keys.row, keys.keys);
    if (needs[2]) {
      at::Tensor pv = p;
      if (keep.defined()) detail::apply_keep_(pv = p.clone(), keep, cfg);
      g.dv.push_back(at::matmul(pv.to(gemm).transpose(-2, -1), g_rows).to(acc));
    }
    if (!needs[0] && !needs[1]) continue;
    at::Tensor dp = at::matmul(g_rows, v_piece.transpose(-2, -1)).to(acc);
    if (keep.defined()) detail::apply_keep_(dp, keep, cfg);
    const at::Tensor ds = dp.sub_(rowsum).mul_(p).to(gemm);
    if (needs[1]) g.dk.push_back(at::matmul(ds.transpose(-2, -1), q_rows).to(acc));
    if (needs[0]) {
      const at::Tensor dq = at::matmul(ds, k_piece).to(acc).mul_(cfg.scale);
      g.dq = g.dq.defined() ? g.dq.add_(dq) : dq;
    }
  }
  return g;
}

// A chunk of keys and values in one tensor, (2, B, Hkv, T / c, hd): one message a step.
at::Tensor packed(const at::Tensor& k, const at::Tensor& v) { return at::stack({k, v}); }

// A pass round the ring under way: what this rank sends (kept until the pass is done) and what
// it receives.
struct Incoming {
  at::Tensor out, tensor;
  std::unique_ptr<RingPass> pass;
  bool posted() const { return tensor.defined(); }
  // Posts `sending` round the ring into a new tensor shaped like it (allocated first: a kernel that
  // finds no room here has posted nothing).
  void post(TensorParallelGroup& group, const at::Tensor& sending, const char* what) {
    at::Tensor in = at::empty_like(sending);
    pass = group.pass_along_ring(sending, in, what);
    out = sending;
    tensor = in;
  }
  // Waits (again, after a run that found no room: at once) and gives up what arrived.
  at::Tensor arrived() {
    pass->wait();
    at::Tensor in = tensor;
    *this = {};
    return in;
  }
};

// One forward call's progress, kept across the runs of its kernel.
struct ForwardProgress {
  bool started = false;
  int64_t step = 0;
  size_t block = 0;     // the query blocks of this step merged so far
  at::Tensor chunk;     // (2, B, Hkv, T / c, hd): rank (r - step)'s keys and values
  Incoming next;        // rank (r - step - 1)'s, arriving
  at::Tensor out, lse;  // (B, Hkv, G, T / c, hd) and (B, Hkv, G, T / c), accumulate type: merged so far
};

// One backward call's progress, kept across the runs of its kernel.
struct BackwardProgress {
  bool started = false, passed = false;  // passed: this step's gradient sums are on their way
  int64_t step = 0;
  size_t block = 0;
  at::Tensor chunk;     // as forward's
  Incoming next;
  at::Tensor mine;      // (2, B, Hkv, T / c, hd) accumulate type: this rank's queries' part of the chunk's dk, dv
  at::Tensor total;     // mine and the previous rank's sums, about to be passed on
  Incoming sums;        // the previous rank's sums for the chunk this rank holds; at the end, its own
  at::Tensor home;      // this rank's own sums, arrived
  at::Tensor dq;        // (B, Hkv, G, T / c, hd), accumulate type
};

class RingAttentionOp final : public Op {
 public:
  RingAttentionOp(TensorParallelGroup& group, const ContextLayout& layout, const AttentionConfig& cfg)
      : Op(detail::context_attention_traits("ring_attention", cfg, layout.ranks)), group_(group), layout_(layout), cfg_(cfg) {}

  TensorList forward(const TensorList& in, const ForwardContext&) const override {
    const at::Tensor& q = in[0];
    const AttentionDims d = AttentionDims::of(q.sizes(), in[1].sizes(), q.device());
    const at::ScalarType acc = detail::accumulate_type(q);
    ForwardProgress& f = forward_;
    if (!f.started) {
      f.chunk = packed(in[1], in[2]);
      f.out = at::zeros({d.B, d.Hkv, d.G, d.T, d.hd}, q.options().dtype(acc));
      f.lse = at::full({d.B, d.Hkv, d.G, d.T}, -std::numeric_limits<double>::infinity(), q.options().dtype(acc));
      f.started = true;
    }
    const std::vector<QueryBlock> blocks = detail::query_blocks(d, cfg_);
    for (; f.step < layout_.ranks; ++f.step, f.block = 0) {
      if (f.step + 1 < layout_.ranks && !f.next.posted()) f.next.post(group_, f.chunk, "context parallelism's key/value ring (forward)");
      const std::vector<SequencePiece> chunk = source(f.step).pieces(length(d));
      for (; f.block < blocks.size(); ++f.block) {
        const QueryBlock& blk = blocks[f.block];
        const std::vector<SeenKeys> seen = seen_keys(blk, chunk, cfg_.causal);
        if (seen.empty()) continue;
        auto [o, l] = chunk_forward(detail::block_rows(q, blk, d, q.scalar_type(), cfg_.scale), f.chunk[0], f.chunk[1],
                                    seen, blk, d, cfg_);
        merge(f, blk, o.view({d.B, d.Hkv, d.G, blk.n, d.hd}), l.view({d.B, d.Hkv, d.G, blk.n}));
      }
      if (f.next.posted()) f.chunk = f.next.arrived();
    }
    // Laid out (B, T, H, hd) as attention.cpp's output, in q's type; lse (B, H, T).
    at::Tensor out = at::empty({d.B, d.T, d.H, d.hd}, q.options());
    out.view({d.B, d.T, d.Hkv, d.G, d.hd}).permute({0, 2, 3, 1, 4}).copy_(f.out);
    const at::Tensor lse = f.lse.view({d.B, d.H, d.T});
    forward_ = {};
    return {out.transpose(1, 2), lse};
  }

  TensorList backward(const BackwardArgs& a) const override {
    if (!a.grad_outputs[0].defined()) return TensorList(3);  // only the hidden lse had one
    const at::Tensor& q = a.inputs[0];
    const AttentionDims d = AttentionDims::of(q.sizes(), a.inputs[1].sizes(), q.device());
    const at::ScalarType acc = detail::accumulate_type(q), gemm = a.inputs[1].scalar_type();
    BackwardProgress& b = backward_;
    if (!b.started) {
      b.chunk = packed(a.inputs[1], a.inputs[2]);
      b.dq = at::zeros({d.B, d.Hkv, d.G, d.T, d.hd}, q.options().dtype(acc));
      b.started = true;
    }
    const std::vector<QueryBlock> blocks = detail::query_blocks(d, cfg_);
    for (; b.step < layout_.ranks; ++b.step, b.block = 0, b.passed = false) {
      if (b.step + 1 < layout_.ranks && !b.next.posted()) b.next.post(group_, b.chunk, "context parallelism's key/value ring (backward)");
      if (!b.passed && !b.mine.defined()) b.mine = at::zeros(b.chunk.sizes(), b.chunk.options().dtype(acc));
      const std::vector<SequencePiece> chunk = source(b.step).pieces(length(d));
      for (; b.block < blocks.size(); ++b.block) {
        const QueryBlock& blk = blocks[b.block];
        const std::vector<SeenKeys> seen = seen_keys(blk, chunk, cfg_.causal);
        if (seen.empty()) continue;
        const at::Tensor q_rows = detail::block_rows(q, blk, d, gemm, cfg_.scale);
        const at::Tensor g_rows = detail::block_rows(a.grad_outputs[0], blk, d, gemm);
        const at::Tensor lse = detail::block_rows(a.outputs[1].unsqueeze(-1), blk, d, acc);
        const at::Tensor rowsum = (g_rows.to(acc) * detail::block_rows(a.outputs[0], blk, d, acc)).sum(-1, /*keepdim=*/true);
        const ChunkGrads g = chunk_backward(q_rows, g_rows, lse, rowsum, b.chunk[0], b.chunk[1], seen, blk, d, cfg_,
                                            a.needs_input_grad);
        add_in(b, g, seen, blk, d);
      }
      if (!b.passed) pass_sums(b);
      if (b.next.posted()) b.chunk = b.next.arrived();
    }
    // This rank's own sums, home after c steps; kept, as the casts below may find no room.
    if (b.sums.posted()) b.home = b.sums.arrived();
    TensorList grads(3);
    const std::vector<bool>& needs = a.needs_input_grad;
    if (needs[0]) grads[0] = b.dq.view(q.sizes()).to(q.scalar_type());
    if (needs[1]) grads[1] = b.home[0].to(a.input_dtype(1));
    if (needs[2]) grads[2] = b.home[1].to(a.input_dtype(2));
    backward_ = {};
    return grads;
  }

 private:
  // The rank whose keys and values this rank holds at `step`.
  ContextLayout source(int64_t step) const { return {layout_.ranks, (layout_.rank - step % layout_.ranks + layout_.ranks) % layout_.ranks}; }
  int64_t length(const AttentionDims& d) const { return d.S * layout_.ranks; }

  // Merges a block's partial (o, l) against a chunk into the running output: the new values made
  // first, then copied in (a kernel that finds no room while making them has changed nothing).
  static void merge(ForwardProgress& f, const QueryBlock& blk, const at::Tensor& o, const at::Tensor& l) {
    at::Tensor out = f.out.narrow(3, blk.t0, blk.n), lse = f.lse.narrow(3, blk.t0, blk.n);
    const at::Tensor merged = at::logaddexp(lse, l);
    const at::Tensor merged_out = out * (lse - merged).exp_().unsqueeze(-1) + o * (l - merged).exp_().unsqueeze(-1);
    out.copy_(merged_out);
    lse.copy_(merged);
  }

  // Adds a block's gradients into the rank's sums (allocating nothing).
  static void add_in(BackwardProgress& b, const ChunkGrads& g, const std::vector<SeenKeys>& seen, const QueryBlock& blk,
                     const AttentionDims& d) {
    for (size_t i = 0; i < seen.size(); ++i) {
      if (i < g.dk.size()) b.mine[0].narrow(2, seen[i].row, seen[i].keys).add_(g.dk[i]);
      if (i < g.dv.size()) b.mine[1].narrow(2, seen[i].row, seen[i].keys).add_(g.dv[i]);
    }
    if (g.dq.defined()) b.dq.narrow(3, blk.t0, blk.n).add_(g.dq.view({d.B, d.Hkv, d.G, blk.n, d.hd}));
  }

  // The end of a step's backward: this rank's part of the chunk's gradients joins the sums the
  // previous rank passed for it (the chunk's first step has none), and the total goes on to the
  // next. Run again after no room, it goes on from what it had done.
  void pass_sums(BackwardProgress& b) const {
    if (!b.total.defined()) {
      if (b.sums.posted()) {  // added in place: nothing allocated between the wait and `total`
        b.sums.pass->wait();
        b.mine.add_(b.sums.tensor);
        b.sums = {};
      }
      b.total = b.mine;
    }
    b.sums.post(group_, b.total, "context parallelism's key/value-gradient ring (backward)");
    b.total = b.mine = at::Tensor();
    b.passed = true;
  }

  TensorParallelGroup& group_;
  ContextLayout layout_;
  AttentionConfig cfg_;
  mutable ForwardProgress forward_;  // forward and backward each run once per op
  mutable BackwardProgress backward_;
};

}  // namespace

namespace detail {

std::shared_ptr<Op> ring_attention_op(TensorParallelGroup& group, const ContextLayout& layout, const AttentionConfig& cfg) {
  return std::make_shared<RingAttentionOp>(group, layout, cfg);
}

}  // namespace detail
}  // namespace ht

#pragma once
// The blockwise attention kernels of runtime/ops/attention.cpp and their parts, for the ops built
// on them (context parallelism's: runtime/ops/context_attention.cpp, runtime/ops/ring_attention.cpp).

#include "runtime/context_parallel.h"
#include "runtime/op.h"
#include "runtime/tensor.h"
#include "runtime/tensor_parallel.h"

#include <memory>

#include <vector>

namespace ht::detail {

struct AttentionConfig {
  bool causal = false;
  double dropout_p = 0;  // 0 unless training
  double scale = 1;
  uint64_t seed = 0;  // dropout's, when dropout_p > 0
  // The queries' positions among the keys, in row order: empty, query t is at key t's position
  // (T == S when causal); context parallelism's rank holds pieces of the sequence
  // (runtime/context_parallel.h) and attends to the whole of it.
  std::vector<SequencePiece> pieces;
};

// q (B, H, T, hd), k and v (B, Hkv, S, hd); G = H / Hkv query heads share a key head.
struct AttentionDims {
  int64_t B, H, Hkv, G, T, S, hd;
  bool gpu = false;  // the blocks are a GPU's (attention.cpp, kGpuBlockScoreBytes)
  static AttentionDims of(at::IntArrayRef q, at::IntArrayRef k, const at::Device& device) {
    return {q[0], q[1], k[1], q[1] / k[1], q[2], k[2], q[3], device.is_cuda()};
  }
  int64_t block_rows() const;  // queries per block: from the shapes and the kind of device alone
};

// Queries [t0, t0 + n) of every head, at positions [position, position + n) of the keys, against
// keys [0, keys). `index` numbers its dropout mask.
struct QueryBlock {
  int64_t index, t0, n, position, keys;
};

// The query blocks, in row order: each of cfg.pieces (or the whole of T) in blocks of d.block_rows().
std::vector<QueryBlock> query_blocks(const AttentionDims& d, const AttentionConfig& cfg);
// fp32 for fp32, bf16 and fp16 inputs; double stays double (the gradient checks).
at::ScalarType accumulate_type(const at::Tensor& q);
// Rows [t0, t0 + n) of x (B, H, T, e) in type `acc`, folded per key head: (B, Hkv, G * n, e), row
// g * n + r being head g's query t0 + r. Times `scale` if given.
at::Tensor block_rows(const at::Tensor& x, const QueryBlock& blk, const AttentionDims& d, at::ScalarType acc,
                      double scale = 1);
// Dropout's keep-mask number `index` (bools shaped like `scores`, true where kept), drawn from a
// generator seeded with cfg.seed + index: the same bits wherever it is drawn again.
at::Tensor keep_mask(const at::Tensor& scores, uint64_t index, const AttentionConfig& cfg);
// x times the dropout factor (0 or 1 / (1 - p)), in place.
at::Tensor& apply_keep_(at::Tensor& x, const at::Tensor& keep, const AttentionConfig& cfg);

// attention()'s checks of q (B, H, T, hd), k and v (B, Hkv, S, hd), naming what is wrong.
void check_attention_shapes(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double dropout_p);
// -> (out (B, H, T, hd) in q's type, lse (B, H, T) in fp32, or double for double inputs).
std::vector<at::Tensor> blockwise_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                    const AttentionConfig& cfg);
// Backward of that forward, whose inputs are a.inputs[0] (q) and `keys`, `values`, its outputs
// a.outputs: (dq in q's type, dk and dv in fp32 (double for double inputs)); undefined where
// a.needs_input_grad says no.
std::vector<at::Tensor> blockwise_attention_backward_sums(const BackwardArgs& a, const at::Tensor& keys,
                                                          const at::Tensor& values, const AttentionConfig& cfg);

// The traits of context parallelism's attention ops (named `name`), whose ranks attend to the
// keys of `ranks` ranks: collectives, never recomputed (runtime/ops/context_attention.cpp says why).
OpTraits context_attention_traits(const char* name, const AttentionConfig& cfg, int64_t ranks);

// Context parallelism's attention as a ring (runtime/ops/ring_attention.cpp): the op over
// `group`, whose ranks hold the pieces `layout` gives them.
std::shared_ptr<Op> ring_attention_op(TensorParallelGroup& group, const ContextLayout& layout,
                                      const AttentionConfig& cfg);

}  // namespace ht::detail

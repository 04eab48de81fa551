#pragma once
// The blockwise attention kernels of runtime/ops/attention.cpp, for the ops built on them
// (context parallelism's, runtime/ops/context_attention.cpp).

#include "runtime/context_parallel.h"
#include "runtime/op.h"
#include "runtime/tensor.h"

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

}  // namespace ht::detail

#pragma once
// The op set, as functions on ht::Tensor. Each runs through Interpreter::apply(); each op's
// traits, forward and backward live in runtime/ops/<group>.cpp. Shapes: B batch, C channels,
// H/W spatial, T sequence, D features; "..." any leading dimensions.

#include "runtime/context_parallel.h"
#include "runtime/tensor.h"

#include <optional>
#include <vector>

namespace ht {

// --- Elementwise (broadcasting like ATen) -------------------------------------------------
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double scalar);
Tensor mul(const Tensor& a, double scalar);
Tensor div(const Tensor& a, double scalar);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x, bool tanh_approximation = false);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
// x * sigmoid(x) (SwiGLU's gate)
Tensor silu(const Tensor& x);
// silu(gate) * up of x = [gate | up] (..., 2F) -> (..., F): SwiGLU's product, saving x alone.
Tensor swiglu(const Tensor& x);
// x where mask is false, `value` where it is true (mask: bool, broadcast to x).
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator*(const Tensor& a, double s) { return mul(a, s); }
inline Tensor operator/(const Tensor& a, double s) { return div(a, s); }

// --- Linear algebra ---------------------------------------------------------------------------
// x (..., D_in), weight (D_out, D_in), bias (D_out) or undefined -> (..., D_out)
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());
// a (..., N, K), b (..., K, M) -> (..., N, M); batch dimensions broadcast. Both at least 2-d.
Tensor matmul(const Tensor& a, const Tensor& b);
// a (B, N, K), b (B, K, M) -> (B, N, M)
Tensor bmm(const Tensor& a, const Tensor& b);
// weight (V, D), indices (...) int64 -> (..., D)
Tensor embedding(const Tensor& weight, const Tensor& indices);

// --- Convolution and pooling (NCHW) -----------------------------------------------------------
struct Conv2dArgs {
  std::vector<int64_t> stride{1, 1};
  std::vector<int64_t> padding{0, 0};
  std::vector<int64_t> dilation{1, 1};
  int64_t groups = 1;
};
// x (B, C_in, H, W), weight (C_out, C_in/groups, kH, kW), bias (C_out) or undefined
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dArgs& args);
// x (B, C, H, W); stride defaults to the kernel size
Tensor max_pool2d(const Tensor& x, std::vector<int64_t> kernel, std::vector<int64_t> stride = {},
                  std::vector<int64_t> padding = {0, 0}, bool ceil_mode = false);
Tensor avg_pool2d(const Tensor& x, std::vector<int64_t> kernel, std::vector<int64_t> stride = {},
                  std::vector<int64_t> padding = {0, 0}, bool ceil_mode = false,
                  bool count_include_pad = true);
// x (B, C, H, W) -> (B, C, oh, ow)
Tensor adaptive_avg_pool2d(const Tensor& x, std::vector<int64_t> output_size);

// --- Normalization ----------------------------------------------------------------------------
// x (B, C, ...), weight/bias (C). In training, batch statistics are used and the running
// statistics (plain at::Tensors owned by the module, may be undefined) are updated exactly
// once per call, never by a recomputation.
Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                  const at::Tensor& running_mean, const at::Tensor& running_var, bool training,
                  double momentum, double eps);
// x (..., *normalized_shape), weight/bias (*normalized_shape)
Tensor layer_norm(const Tensor& x, std::vector<int64_t> normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps);
// x (..., D), weight (D): x / sqrt(mean(x^2 over D) + eps) * weight, computed in fp32 (Llama's
// RMSNorm). Saves x and the (..., 1) reciprocal root mean square.
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps);

// --- Positions --------------------------------------------------------------------------------
// Rotary position embedding, interleaved pairs (Meta's Llama and torchtitan layout: features
// (2i, 2i+1) of each head rotate by angle p * theta^(-2i/hd)). x (B, T, H, hd), hd even ->
// same; positions start at `offset`. Saves nothing: backward rotates the gradient back.
Tensor rope(const Tensor& x, double theta, int64_t offset = 0);
// The same where x's rows are pieces of the sequence (context parallelism's head and tail chunks,
// runtime/context_parallel.h): rows [row, row + length) at positions [position, position + length).
// The pieces cover x's rows in order.
Tensor rope(const Tensor& x, double theta, const std::vector<SequencePiece>& pieces);

// --- Random -----------------------------------------------------------------------------------
// Zeroes elements with probability p and scales the rest by 1/(1-p). The mask is drawn from a
// seed taken from the interpreter's seed stream, so a recomputation draws the same mask.
Tensor dropout(const Tensor& x, double p, bool training);

// --- Attention --------------------------------------------------------------------------------
// q (B, H, T, hd), k and v (B, Hkv, S, hd) with H a multiple of Hkv (grouped-query attention)
// -> (B, H, T, hd): softmax(q k^T * scale [+ causal mask]) v, scale = 1/sqrt(hd) unless given.
// Causal: query t sees keys 0..t, and T must equal S. One op with a forward and a backward
// kernel (runtime/ops/attention.cpp): it saves q, k, v, the output and the log-sum-exp of each
// row (B, H, T; fp32, or double for double inputs), never the T x S scores, and backward
// recomputes the scores block by block (on CUDA with libtorch >= 2.1, ATen's fused kernel where
// it applies: base/compat.h). Dropout on the probabilities (training, dropout_p > 0)
// draws its masks from a seed taken from the interpreter's seed stream, as dropout() does.
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                 double dropout_p = 0.0, bool training = true,
                 std::optional<double> scale = std::nullopt);

// Context parallelism (runtime/context_parallel.h): q, k and v hold this rank's pieces of the
// sequence, (B, H, T / c, hd) and (B, Hkv, T / c, hd), with c the interpreter's context-parallel
// group's size; the output is attention of these queries over the whole sequence's keys, each
// query at its position (causal: keys up to it). `exchange` says how the keys and values meet the
// queries (ContextExchange): passed round the group's ring, or gathered whole. Every rank of the
// group calls it at the same point. Without a group (or a group of one), attention() itself.
Tensor context_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double dropout_p = 0.0,
                         bool training = true, std::optional<double> scale = std::nullopt,
                         ContextExchange exchange = ContextExchange::kRing);

namespace detail {
// For tests: the keep-mask (B, H, T, S) bool that attention() on these shapes drew with op seed
// `seed` (the interpreter's next_seed() when it was applied); false above a causal diagonal.
at::Tensor attention_dropout_mask(at::IntArrayRef q_sizes, at::IntArrayRef k_sizes, bool causal,
                                  double dropout_p, uint64_t seed, const at::Device& device);
// For benchmarks and tests: forward calls of the attention op so far, by kernel (ATen's fused
// kernels on a GPU, flash among them, or the blockwise one).
struct AttentionKernelCounts {
  int64_t fused = 0, blockwise = 0, flash = 0;
};
AttentionKernelCounts attention_kernel_counts();
}  // namespace detail

// --- Softmax and losses -----------------------------------------------------------------------
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);
// log_probs (N, K), target (N) int64 -> mean negative log-likelihood, a scalar
Tensor nll_loss(const Tensor& log_probs, const Tensor& target);
// logits (N, K), target (N) int64 -> scalar: nll_loss(log_softmax(logits, 1), target), to the
// bit, as one op that never holds the (N, K) log-probabilities whole (chunks of rows)
Tensor cross_entropy(const Tensor& logits, const Tensor& target);
// x (N, D), weight (V, D), target (N) int64 -> cross_entropy(linear(x, weight), target), the
// output layer and its loss together: where the (N, V) logits would pass 2 MiB (fp32), in chunks
// of linear_cross_entropy_rows() rows, each chunk's logits their own tensor (its loss summed,
// the chunks' sums divided by the rows counted), so that no block of all N rows' logits, nor of
// their gradient, exists and a budget regenerates a chunk at a time. The rows by shapes alone:
// every run of a shape runs the same kernels, budgeted or not. Below that size, the two ops.
Tensor linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor& target);
// Rows per chunk of linear_cross_entropy: an eighth of them, and at least 2 MiB of fp32 logits.
int64_t linear_cross_entropy_rows(int64_t rows, int64_t classes);

// --- Tensor parallelism (runtime/tensor_parallel.h) ----------------------------------------------
// Collectives of the interpreter's tensor-parallel group as ops, in every rank's same order; in
// interpreted mode only. Those whose forward exchanges are declared collectives (OpTraits): DTR
// may recompute them, on every rank of the group alike; static plans keep their outputs.
// Megatron's f: x forward (a view), the group's sum of its gradient backward.
Tensor tp_copy(const Tensor& x);
// Megatron's g: the group's sum of x forward, the gradient as it is backward.
Tensor tp_reduce(const Tensor& x);
// Sequence parallelism: the group's sum of x, this rank's piece along `dim` (of size / group
// size); backward all-gathers the gradient.
Tensor tp_reduce_scatter(const Tensor& x, int64_t dim);
// Sequence parallelism into a column-parallel linear: every rank's piece of x gathered along
// `dim`, then linear(). Saves the piece, not the gathered input: backward gathers it again and
// reduce-scatters the input's gradient.
Tensor tp_gather_linear(const Tensor& x, int64_t dim, const Tensor& weight, const Tensor& bias = Tensor());
// Rows [first_row, first_row + weight.size(0)) of a vocabulary's embedding (V_r, D), indices
// (...) -> (..., D): zeros for a token another rank holds. tp_reduce of it is the lookup.
Tensor vocab_parallel_embedding(const Tensor& weight, const Tensor& indices, int64_t first_row);
// logits (N, K) are columns [first, first + K) of the vocabulary's, of which the first `valid`
// are real (the rest padding, ignored), target (N) int64 -> the mean cross entropy over the
// whole vocabulary, a scalar equal on every rank. The whole logits never exist on one rank.
Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& target, int64_t first, int64_t valid);

// --- Precision --------------------------------------------------------------------------------
// x converted to a floating dtype (x itself if it has it); the gradient converts back.
// Interpreter::set_autocast inserts these by each op's declared Precision (runtime/op.h).
Tensor cast(const Tensor& x, at::ScalarType dtype);

// --- Shape ------------------------------------------------------------------------------------
// Views share their base's storage (docs/engine.md).
Tensor reshape(const Tensor& x, std::vector<int64_t> shape);
Tensor view(const Tensor& x, std::vector<int64_t> shape);
// A dense copy of x, or x itself (a view) when it is dense already.
Tensor contiguous(const Tensor& x);
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1);
Tensor permute(const Tensor& x, std::vector<int64_t> dims);
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Tensor cat(const std::vector<Tensor>& xs, int64_t dim);
// Pieces of `split_size` along dim (the last may be smaller): one output per piece.
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim);
// Pieces of the given sizes along dim (they add up to its length).
std::vector<Tensor> split(const Tensor& x, std::vector<int64_t> sizes, int64_t dim);
Tensor sum(const Tensor& x);
Tensor sum(const Tensor& x, std::vector<int64_t> dims, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, std::vector<int64_t> dims, bool keepdim = false);

}  // namespace ht

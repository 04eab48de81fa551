#pragma once
// Helpers shared by the op definitions in runtime/ops/.

#include "runtime/interpreter.h"
#include "runtime/op.h"
#include "runtime/ops.h"

#include <memory>
#include <vector>

namespace ht::detail {

// Runs `op` and returns its first output (hidden outputs are dropped by the caller's scope).
inline Tensor apply_first(std::shared_ptr<const Op> op, const std::vector<Tensor>& inputs) {
  return inputs.front().interp().apply(std::move(op), inputs)[0];
}

// The gradient reaching an input that was broadcast: summed back to the input's shape.
inline at::Tensor reduce_to(const at::Tensor& grad, at::IntArrayRef sizes) {
  return at::sum_to(grad, sizes);
}

// Bit for input i if that input requires a gradient.
inline uint32_t bit_if(bool cond, int i) { return cond ? (1u << i) : 0u; }

inline int64_t normalize_dim(int64_t dim, int64_t ndim) { return dim < 0 ? dim + ndim : dim; }

// at::embedding and its dense backward, or on meta tensors their outputs' shapes (libtorch 1.13
// has no meta kernel for either: runtime/op.h).
at::Tensor embedding_rows(const at::Tensor& weight, const at::Tensor& indices);
at::Tensor embedding_rows_backward(const at::Tensor& grad, const at::Tensor& indices, int64_t rows);

// relu keeping a 1-bit mask for backward instead of its output (runtime/ops/relu_mask.cpp).
Tensor relu_with_mask(const Tensor& x);

}  // namespace ht::detail

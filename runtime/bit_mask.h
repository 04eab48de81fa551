#pragma once
// 1-bit masks (memory.compress, GIST's "binarize"): a boolean tensor packed eight to a byte. A
// ReLU's backward reads only whether each output was positive, so the ReLU under compression
// (runtime/ops/relu_mask.cpp) keeps this for backward instead of its output: 1/32 of an fp32
// output's bytes, and the output itself is freed after its last forward use unless another op
// saves it. A loop on CPU; ATen ops elsewhere (CUDA).

#include <ATen/core/Tensor.h>

namespace ht {

// `mask` (bool, any shape) as ceil(numel / 8) bytes, element i in bit i % 8 of byte i / 8.
at::Tensor pack_bits(const at::Tensor& mask);
// The bool tensor of `sizes` that pack_bits packed into `packed`.
at::Tensor unpack_bits(const at::Tensor& packed, at::IntArrayRef sizes);

}  // namespace ht

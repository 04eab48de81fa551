#pragma once
// Tensor and sequence parallelism (parallel.tensor_parallel, parallel.sequence_parallel) in a
// prediction. Plain functions of a decoder's shape and the layout, so that a planner for clusters
// reuses them:
// - memory: a profile of a split model is one rank's (launcher/planning/profiler.cpp profiles
//   rank 0's part with a mirrored group: its parameters, gradients, optimizer state and
//   activations exactly), so the memory terms need nothing more. layer_activation_bytes() is this
//   project's accounting of what one decoder layer saves for backward per rank, tensor by
//   tensor, against which bench/tensor_parallel holds the measured bytes (docs/parallelism.md).
// - time: every collective of a micro-batch's forward and backward (tensor_parallel_traffic(), the
//   ops of runtime/ops/tensor_parallel.cpp as the decoder calls them) over the group's link, a
//   ring (alpha-beta: an all-reduce 2 (t - 1) steps of n / t, an all-gather or reduce-scatter
//   t - 1), on the critical path: the trainer overlaps none of them.

#include "models/decoder_options.h"
#include "planner/machine.h"

#include <cstdint>
#include <string>

namespace ht {

// What the terms need of a decoder (models/decoder_options.h, as plain data).
struct TensorShape {
  bool llama = true;        // false: GPT-2 (LayerNorm with bias, biases, learned positions, GELU)
  int64_t layers = 0;
  int64_t hidden = 0;       // h
  int64_t sequence = 0;     // s: the sequence length trained (block_size)
  int64_t heads = 0, kv_heads = 0;
  int64_t mlp_hidden = 0;   // f
  int64_t padded_vocab = 0; // the vocabulary padded to a multiple of t
  bool defined() const { return layers > 0; }
};

// The terms' view of a decoder's shape (its tensor_parallel sets the padded vocabulary).
TensorShape tensor_shape(const DecoderOptions& options);

// Elements handed to the group's collectives by one rank in one micro-batch's forward and
// backward, as TensorGroup counts them (an all-reduce's tensor, an all-gather's or a
// reduce-scatter's whole), and the calls.
struct TensorTraffic {
  int64_t allreduce_elements = 0, allgather_elements = 0, reducescatter_elements = 0;
  int64_t allreduce_calls = 0, allgather_calls = 0, reducescatter_calls = 0;
  // Of those, the activation-sized ones (b s h elements each) in forward, in backward, and the
  // all-gathers backward repeats (sequence parallelism gathers a column-parallel layer's input
  // again rather than keep it): what the layout's formula counts.
  int64_t forward_activation_elements = 0, backward_activation_elements = 0, regathered_elements = 0;
  bool sequence_parallel = false;
  int64_t elements() const { return allreduce_elements + allgather_elements + reducescatter_elements; }
};

TensorTraffic tensor_parallel_traffic(const TensorShape& shape, int64_t micro_batch, int t, bool sequence_parallel);
// The traffic's time over a group of `t` ranks on one node (ms), activation-sized collectives at
// `activation_bytes` per element (4 in fp32, 2 under bf16 autocast), the rest (norm weights,
// the loss's row statistics) at 4.
double tensor_parallel_ms(const Machine& machine, int t, const TensorTraffic& traffic, int64_t activation_bytes);
// Bytes one decoder layer saves for backward on one rank (no dropout), tensor by tensor
// (docs/memory.md lists them): activations at `element_bytes` each (4 in fp32, 2 under
// training.mixed_precision = "bf16" or "fp16"), the norms' and attention's per-row statistics in
// fp32; `why` (may be null) gets the list in words. Under 16-bit autocast the layer's weights'
// 16-bit copies are not counted: they are the model's, not its activations.
int64_t layer_activation_bytes(const TensorShape& shape, int64_t micro_batch, int t, bool sequence_parallel,
                               std::string* why = nullptr, int64_t element_bytes = 4);

}  // namespace ht

#pragma once
// Context parallelism (parallel.context_parallel = c, issue 68): each rank of a context group holds
// 1/c of every sequence. The sequence of T tokens is cut into 2c chunks of T / 2c; rank r holds
// chunk r and its mirror 2c - 1 - r, in that order (torchtitan's and Megatron's head-tail
// balancing). Under causal masking the queries of chunk j see (j + 1/2) chunks of keys on
// average, so every rank's pair sees 2c of them alike: no rank waits for another at an exchange.
// (Contiguous quarters would give rank c - 1 about 2c - 1 times rank 0's work.)
//
// Tokens, labels and positions (and so the rotary angles) all follow this one order; attention
// gathers the group's keys and values and puts them back in sequence order, so its output rows
// are this rank's queries in this order (runtime/ops.h, context_attention).

#include "base/choice.h"

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace ht {

// How the keys and values of a context group meet its queries (parallel.context_exchange):
// - kRing: each rank's go round the group, one rank a step, passed on while the rank computes
//   with them (runtime/ops/ring_attention.cpp): a rank holds two chunks of them, O(T / c);
// - kAllGather: gathered whole for the kernel, once in forward and again in backward
//   (runtime/ops/context_attention.cpp; Llama 3's choice): one collective, O(T) while it runs.
enum class ContextExchange { kRing, kAllGather };
template <>
struct ChoiceNames<ContextExchange> {
  static constexpr std::pair<ContextExchange, const char*> table[] = {{ContextExchange::kRing, "ring"},
                                                                      {ContextExchange::kAllGather, "all_gather"}};
};

// A run of consecutive positions of the sequence held in consecutive rows of a rank's part:
// rows [row, row + length) are positions [position, position + length).
struct SequencePiece {
  int64_t row = 0, position = 0, length = 0;
};

struct ContextLayout {
  int64_t ranks = 1, rank = 0;

  bool on() const { return ranks > 1; }
  // "" when a sequence of `length` tokens divides into 2 x ranks chunks, else why not and what would.
  std::string problem(int64_t length) const;
  // This rank's pieces of a sequence of `length` tokens: one (the whole) when off, else two.
  std::vector<SequencePiece> pieces(int64_t length) const;
  // The positions of this rank's `length / ranks` tokens, int64 on `device`.
  at::Tensor positions(int64_t length, const at::Device& device) const;
  // This rank's part of `whole` along `dim` (whole.size(dim) is the sequence): a new tensor.
  at::Tensor part_of(const at::Tensor& whole, int64_t dim) const;
  // The inverse over the group: `parts` (ranks, ..., length / ranks along dim + 1, ...), rank r's
  // part at index r, put back in sequence order along `dim` of one part: (..., length, ...).
  at::Tensor in_sequence_order(const at::Tensor& parts, int64_t dim) const;
  // The inverse of in_sequence_order: `whole` (..., length along dim, ...) -> (ranks, ..., length /
  // ranks, ...), rank r's part at index r.
  at::Tensor by_rank(const at::Tensor& whole, int64_t dim) const;
};

}  // namespace ht

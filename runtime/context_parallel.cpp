#include "runtime/context_parallel.h"

#include <ATen/ATen.h>

namespace ht {

std::string ContextLayout::problem(int64_t length) const {
  if (ranks < 1 || rank < 0 || rank >= ranks) {
    return "context parallelism needs 0 <= rank < ranks, got rank " + std::to_string(rank) + " of " +
           std::to_string(ranks);
  }
  if (!on() || (length > 0 && length % (2 * ranks) == 0)) return "";
  const int64_t step = 2 * ranks, below = length / step * step, above = below + step;
  return "a sequence of " + std::to_string(length) + " tokens does not divide into 2 x " + std::to_string(ranks) +
         " chunks (each rank holds one chunk from the front and its mirror from the back); " +
         (below > 0 ? "use " + std::to_string(below) + " or " + std::to_string(above) : "use " + std::to_string(above)) +
         " tokens, or a context_parallel c with 2c dividing " + std::to_string(length);
}

std::vector<SequencePiece> ContextLayout::pieces(int64_t length) const {
  if (!on()) return {{0, 0, length}};
  const int64_t chunk = length / (2 * ranks);
  return {{0, rank * chunk, chunk}, {chunk, (2 * ranks - 1 - rank) * chunk, chunk}};
}

at::Tensor ContextLayout::positions(int64_t length, const at::Device& device) const {
  const auto longs = at::TensorOptions().dtype(at::kLong).device(device);
  std::vector<at::Tensor> runs;
  for (const SequencePiece& p : pieces(length)) runs.push_back(at::arange(p.position, p.position + p.length, longs));
  return at::cat(runs);
}

at::Tensor ContextLayout::part_of(const at::Tensor& whole, int64_t dim) const {
  if (!on()) return whole;
  std::vector<at::Tensor> runs;
  for (const SequencePiece& p : pieces(whole.size(dim))) runs.push_back(whole.narrow(dim, p.position, p.length));
  return at::cat(runs, dim);
}

namespace {

// `t` with its first dimension reversed: flip has no meta kernel in libtorch 1.13, and a traced
// step (launcher/planning/meta_trace.h) runs the gathered attention on meta tensors.
at::Tensor reversed(const at::Tensor& t) {
  std::vector<at::Tensor> rows;
  for (int64_t r = t.size(0) - 1; r >= 0; --r) rows.push_back(t.narrow(0, r, 1));
  return at::cat(rows, 0);
}

}  // namespace

at::Tensor ContextLayout::in_sequence_order(const at::Tensor& parts, int64_t dim) const {
  const int64_t chunk = parts.size(dim + 1) / 2;
  // Heads in rank order, then tails in reverse rank order: chunks 0, 1, ..., 2c - 1.
  auto laid = [&](at::Tensor half) { return half.movedim(0, dim).flatten(dim, dim + 1); };
  const at::Tensor heads = laid(parts.narrow(dim + 1, 0, chunk));
  const at::Tensor tails = laid(reversed(parts.narrow(dim + 1, chunk, chunk)));
  return at::cat({heads, tails}, dim);
}

at::Tensor ContextLayout::by_rank(const at::Tensor& whole, int64_t dim) const {
  const int64_t chunk = whole.size(dim) / (2 * ranks), half = ranks * chunk;
  auto stacked = [&](const at::Tensor& h) { return h.unflatten(dim, {ranks, chunk}).movedim(dim, 0); };
  const at::Tensor heads = stacked(whole.narrow(dim, 0, half));
  const at::Tensor tails = reversed(stacked(whole.narrow(dim, half, half)));
  return at::cat({heads, tails}, dim + 1);
}

}  // namespace ht

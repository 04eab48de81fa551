#include "planner/pipeline_terms.h"

#include <algorithm>
#include <tuple>
#include <utility>

// The stages' memory terms from one micro-batch's trace (pipeline_terms.h: stage_cut_bytes,
// block_memory, set_stage_terms, stage_boundary_bytes): which tensors cross each cut, what each
// block holds for backward and what its kernels peak at.

namespace ht {

namespace {

// Per tensor, the last block whose forward reads it (-1: none).
std::vector<int> last_forward_reader(const StepTrace& trace) {
  std::vector<int> last_reader(trace.tensors.size(), -1);
  for (const TraceKernel& k : trace.kernels) {
    if (k.backward || k.block < 0) continue;
    for (int i : k.inputs) {
      if (i >= 0 && static_cast<size_t>(i) < last_reader.size())
        last_reader[static_cast<size_t>(i)] = std::max(last_reader[static_cast<size_t>(i)], k.block);
    }
  }
  return last_reader;
}

// The cuts' bytes of the tensors `counted` says to count.
template <typename Counted>
std::vector<int64_t> cut_bytes_of(const StepTrace& trace, int blocks, const std::vector<int>& last_reader,
                                  Counted&& counted) {
  // Each tensor crosses the cuts from its producer's block to the last block whose forward reads it.
  std::vector<int64_t> change(static_cast<size_t>(std::max(blocks, 0)) + 1, 0);
  for (size_t i = 0; i < trace.tensors.size(); ++i) {
    const int producer = trace.tensors[i].producer;
    if (producer < 0 || static_cast<size_t>(producer) >= trace.kernels.size()) continue;
    const int from = trace.kernels[static_cast<size_t>(producer)].block, to = std::min(last_reader[i], blocks);
    if (from < 0 || to <= from || !counted(i)) continue;
    change[static_cast<size_t>(from)] += trace.tensors[i].bytes;
    change[static_cast<size_t>(to)] -= trace.tensors[i].bytes;
  }
  std::vector<int64_t> cuts(static_cast<size_t>(std::max(blocks, 0)), 0);
  int64_t running = 0;
  for (size_t b = 0; b < cuts.size(); ++b) cuts[b] = running += change[b];
  return cuts;
}

}  // namespace

std::vector<int64_t> stage_cut_bytes(const StepTrace& trace, int blocks) {
  return cut_bytes_of(trace, blocks, last_forward_reader(trace), [](size_t) { return true; });
}

namespace {

// Each tensor's block (its producer's, else that of the kernel running or last run when it was
// allocated; -1 for what came before the first kernel: the batch) and whether forward left it for
// backward (alive when the first backward kernel begins).
struct Owners {
  std::vector<int> block;
  std::vector<char> held;
};

// The block a kernel's memory counts with: its own; the loss's, outside the blocks, the last.
int block_of(const StepTrace& trace, int kernel, int blocks) {
  const int b = trace.kernels[static_cast<size_t>(kernel)].block;
  return b < 0 || b >= blocks ? blocks - 1 : b;
}

Owners owners(const StepTrace& trace, int blocks) {
  Owners o{std::vector<int>(trace.tensors.size(), -1), std::vector<char>(trace.tensors.size(), 0)};
  bool backward = false;
  int last_kernel = -1;
  for (const TraceEvent& ev : trace.events) {
    const auto i = static_cast<size_t>(ev.index);
    if (ev.kind == TraceEvent::Kind::kKernelBegins) {
      last_kernel = ev.index;
      backward = backward || trace.kernels[i].backward;
    } else if (ev.kind == TraceEvent::Kind::kAllocated && last_kernel >= 0) {
      const int producer = trace.tensors[i].producer;
      o.block[i] = block_of(trace, producer >= 0 && static_cast<size_t>(producer) < trace.kernels.size() ? producer : last_kernel,
                            blocks);
      o.held[i] = !backward;
    } else if (ev.kind == TraceEvent::Kind::kFreed && !backward) {
      o.held[i] = 0;
    }
  }
  return o;
}

}  // namespace

namespace {

// A weight's cast (is_weight_cast) made tensor i.
bool made_by_weight_cast(const StepTrace& trace, size_t i) {
  const int producer = trace.tensors[i].producer;
  return producer >= 0 && static_cast<size_t>(producer) < trace.kernels.size() &&
         is_weight_cast(trace.kernels[static_cast<size_t>(producer)]);
}

// BlockMemory's peak and peak_backward: at each allocation inside block c's kernels, its own held
// tensors alive, the transient ones it made, and those its neighbours made (outputs on their way
// in, gradients on their way back), each counted only where the neighbour shares c's stage
// (BlockMemory::peak's index). Tensors `skip` marks are not there at all.
std::pair<std::vector<int64_t>, std::vector<int64_t>> block_peaks(const StepTrace& trace, int blocks, const Owners& o,
                                                                  const std::vector<char>& crosses,
                                                                  const std::vector<char>& skip) {
  std::vector<int64_t> peak(4 * static_cast<size_t>(blocks), 0), peak_backward(4 * static_cast<size_t>(blocks), 0);
  std::vector<int64_t> own(static_cast<size_t>(blocks), 0), made(static_cast<size_t>(blocks), 0),
      kept(static_cast<size_t>(blocks), 0);
  std::vector<char> alive(trace.tensors.size(), 0);
  int running = -1;
  bool backward = false;
  for (const TraceEvent& ev : trace.events) {
    const auto i = static_cast<size_t>(ev.index);
    if (ev.kind == TraceEvent::Kind::kKernelBegins) {
      running = block_of(trace, ev.index, blocks);
      backward = backward || trace.kernels[i].backward;
    } else if (ev.kind == TraceEvent::Kind::kAllocated && o.block[i] >= 0 && !skip[i]) {
      alive[i] = 1;
      (o.held[i] ? own : made)[static_cast<size_t>(o.block[i])] += trace.tensors[i].bytes;
      const auto c = static_cast<size_t>(running);
      const int64_t base = own[c] + made[c];
      const int64_t left = c > 0 ? made[c - 1] : 0, right = c + 1 < made.size() ? made[c + 1] : 0;
      const int64_t with[4] = {base + kept[c], base + left + kept[c], base + right, base + left + right};
      for (size_t k = 0; k < 4; ++k) {
        peak[4 * c + k] = std::max(peak[4 * c + k], with[k]);
        if (backward) peak_backward[4 * c + k] = std::max(peak_backward[4 * c + k], with[k]);
      }
    } else if (ev.kind == TraceEvent::Kind::kFreed && alive[i]) {
      alive[i] = 0;
      (o.held[i] ? own : made)[static_cast<size_t>(o.block[i])] -= trace.tensors[i].bytes;
      if (crosses[i]) kept[static_cast<size_t>(o.block[i])] += trace.tensors[i].bytes;
    }
  }
  return {std::move(peak), std::move(peak_backward)};
}

}  // namespace

BlockMemory block_memory(const StepTrace& trace, int blocks) {
  BlockMemory out;
  if (blocks <= 0 || trace.kernels.empty()) return out;
  const Owners o = owners(trace, blocks);
  out.held.assign(static_cast<size_t>(blocks), 0);
  out.weight_casts.assign(static_cast<size_t>(blocks), 0);
  std::vector<char> casts(trace.tensors.size(), 0);
  for (size_t i = 0; i < trace.tensors.size(); ++i) {
    if (!o.held[i]) continue;
    out.held[static_cast<size_t>(o.block[i])] += trace.tensors[i].bytes;
    if (!made_by_weight_cast(trace, i)) continue;
    casts[i] = 1;
    out.weight_casts[static_cast<size_t>(o.block[i])] += trace.tensors[i].bytes;
  }
  const std::vector<int> reader = last_forward_reader(trace);
  out.sent_unheld = cut_bytes_of(trace, blocks, reader, [&](size_t i) { return !o.held[i]; });
  out.sent_held = cut_bytes_of(trace, blocks, reader, [&](size_t i) { return o.held[i] != 0; });
  // A held tensor a later block's forward reads crosses the cut after its block. On one rank that
  // block's backward frees it; a stage ending at its block keeps it (its output, InFlight::output)
  // until the micro-batch's backward ends: in the variants without a right neighbour it stays.
  std::vector<char> crosses(trace.tensors.size(), 0);
  for (size_t i = 0; i < trace.tensors.size(); ++i) crosses[i] = o.held[i] && o.block[i] >= 0 && reader[i] > o.block[i];
  std::tie(out.peak, out.peak_backward) = block_peaks(trace, blocks, o, crosses, std::vector<char>(trace.tensors.size(), 0));
  std::tie(out.peak_without_casts, out.peak_backward_without_casts) = block_peaks(trace, blocks, o, crosses, casts);
  return out;
}

void set_stage_terms(ProfilePoint& point) {
  const int blocks = static_cast<int>(point.blocks.size());
  point.cut_bytes = stage_cut_bytes(point.trace, blocks);
  BlockMemory memory = block_memory(point.trace, blocks);
  point.block_held_bytes = std::move(memory.held);
  point.block_peak_bytes = std::move(memory.peak);
  point.block_peak_backward_bytes = std::move(memory.peak_backward);
  point.block_sent_unheld_bytes = std::move(memory.sent_unheld);
  point.block_sent_held_bytes = std::move(memory.sent_held);
  point.block_weight_cast_bytes = std::move(memory.weight_casts);
  point.block_peak_without_casts_bytes = std::move(memory.peak_without_casts);
  point.block_peak_backward_without_casts_bytes = std::move(memory.peak_backward_without_casts);
}

int64_t stage_boundary_bytes(const ProfilePoint& point, int block, int64_t micro_batch) {
  if (block < 0 || static_cast<size_t>(block) >= point.cut_bytes.size()) return 0;
  const int64_t bytes = point.cut_bytes[static_cast<size_t>(block)];
  if (point.micro_batch <= 0) return bytes;
  return static_cast<int64_t>(static_cast<double>(bytes) * static_cast<double>(micro_batch) /
                              static_cast<double>(point.micro_batch));
}

}  // namespace ht

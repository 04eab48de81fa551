#pragma once
// Host swap: the third answer, beside keeping and recomputing, for an activation that does not
// fit (memory.policy = "swap" or "hybrid"). A tensor saved for backward is copied to host memory
// while forward goes on; once the copy is done, dropping it from the device costs nothing now and
// a copy back later, which backward starts ahead of use (prefetch) so that it runs under compute.
//
//   swap    vDNN's rule (Rhu et al. 2016): the feature maps around convolutions and matmuls that
//           backward reads (their saved inputs, and their outputs wherever a backward saves them,
//           as batch norm and GELU do) are copied out; eviction takes copied tensors first, waits
//           for copies still running, and recomputes (DTR) only when nothing is left to swap.
//   hybrid  Capuchin's (Peng et al. 2020): copy out only what the link can hide, that is, while
//           the copy would finish before forward ends (the last step's forward time, less the
//           time already spent and the link's backlog); everything else is recomputed, chosen
//           by DTR's score, which is memory saved per second of recomputation, weighed by
//           staleness. Tensors made late in forward, read early in backward, are recomputed:
//           their copy back could not hide. And when eviction must drop a tensor with no copy,
//           it is copied out first (waiting for it) if that costs less than recomputing it
//           would: Capuchin's swap-or-recompute choice, made per victim.
//
// The memory manager owns it and asks it first for victims; the interpreter asks it to bring a
// dropped tensor back before it would recompute one; the tape asks it to prefetch the saved
// values of the next entries. Swap and recomputation never both regenerate one tensor: a tensor
// with a host copy always comes back by the copy.

#include "alloc/host_link.h"
#include "runtime/tensor_info.h"

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

namespace ht {

class MemoryTimeline;

enum class SwapRule : uint8_t {
  kConvAndMatmul,  // swap: vDNN
  kHidden,         // hybrid: Capuchin
  kPlanned,        // per_block with memory.block_offload: only what a block's plan offloads (offload())
};

struct SwapOptions {
  SwapRule rule = SwapRule::kConvAndMatmul;
  std::shared_ptr<HostLink> link;
  int64_t host_budget_bytes = 0;   // host memory for copies; a copy that would pass it is not made
  int64_t min_bytes = 64 << 10;    // smaller tensors are not worth a copy
  int lookahead_entries = 24;      // backward prefetches the saved values of this many entries ahead
  bool bf16_on_link = false;       // memory.compress = "bf16": fp32 values cross, and wait on host, as bf16
};

struct SwapStats {
  int64_t copies_out = 0, bytes_out = 0;
  int64_t copies_in = 0, bytes_in = 0;
  int64_t prefetched_in = 0;        // copies in started ahead of use
  int64_t bytes_in_hidden = 0;      // bytes in whose copy was done before the read needed it
  int64_t refused_host_full = 0;    // copies not made: the host budget was full
  int64_t drops = 0;                // tensors dropped because a host copy existed
  int64_t copied_before_drop = 0;   // hybrid: victims copied out (waited for) rather than recomputed
  int64_t prefetches_cancelled = 0; // prefetches given back when memory ran short
  double wait_ms = 0;               // compute waiting for copies (in, or out to free memory)
  int64_t gradients_parked = 0;     // backward's gradients in flight moved to host (bytes counted in and out)
  int64_t host_bytes = 0, peak_host_bytes = 0;
};

class HostSwap {
 public:
  explicit HostSwap(SwapOptions options);
  ~HostSwap();
  const SwapOptions& options() const { return options_; }
  const SwapStats& stats() const { return stats_; }
  void reset_peak() { stats_.peak_host_bytes = stats_.host_bytes; }
  void set_timeline(MemoryTimeline* timeline) { timeline_ = timeline; }

  // A training step's forward begins / its backward begins (the hybrid rule's clock).
  void step_begins();
  void backward_begins();

  // Backward will read `t` (a root, resident), saved by an op that is a convolution or a matmul
  // (`read_by_heavy_op`) or not: copy it out if the rule says so.
  void consider(TensorInfo& t, bool read_by_heavy_op);
  // per_block's plan offloads `t` (a resident root its block made): starts its copy to host. False
  // if it cannot go (too small, a view, the host full): the caller drops it to be regenerated.
  bool offload(TensorInfo& t) { return start_out(t); }
  // An offloaded `t` whose copy is still running: waits for it (counted as a wait) if `wait`.
  // True once its copy is done (it can then be dropped for free).
  bool copied_out(TensorInfo& t, bool wait);
  // Hybrid: eviction chose `victim` (no host copy) to drop and recompute later at `recompute_ms`;
  // if copying it out now, and waiting for the copy, costs less, does so (the copy back will be
  // prefetched). True if it is now on host.
  bool copy_before_drop(TensorInfo& victim, double recompute_ms);
  // A resident root whose host copy is done, to drop for free (the largest); null if none.
  TensorInfo* pick_victim(const std::vector<TensorInfo*>& candidates) const;
  // A resident root with a finished host copy that backward reads after `sooner` (made before it
  // in forward; the earliest made), to drop for a prefetch of `sooner`; null if none.
  TensorInfo* later_victim(const std::vector<TensorInfo*>& candidates, const TensorInfo& sooner) const;
  // Waits for the oldest copy to host still running among `candidates` (its tensor can then be
  // dropped); false if none is running.
  bool wait_for_copy_out(const std::vector<TensorInfo*>& candidates);
  // `t` (with a host copy) was dropped from the device: counted, and its copy out traced.
  void dropped(TensorInfo& t);

  // The device value of a dropped root with a host copy: waits for the copy back (starting it if
  // no prefetch did). The caller attaches it.
  at::Tensor bring_back(TensorInfo& t);
  // Starts copying `t` (a dropped root with a host copy) back if its bytes fit the arena without
  // evicting anything; true if it is on its way (or already was), false if there was no room.
  // `allocate` allocates device bytes without making room (the manager's), null if none fit.
  template <typename Allocate>
  bool prefetch(TensorInfo& t, Allocate&& allocate);

  // Memory is short and nothing can be dropped: gives back the device bytes of the prefetch
  // started last (read furthest ahead), which will be copied again when read. False if none.
  bool cancel_prefetch();

  // `t` no longer needs its host copy (its record goes, or nobody will read it again); a parked
  // gradient goes too.
  void release(TensorInfo& t);

  // Backward's gradient in flight for `t` (t.grad, nobody else holding its storage) to host
  // memory, waiting for the copy, so that its device bytes are free: the last resort when memory
  // runs out and no value can be dropped. False if it cannot be (shared, too small, host full).
  bool park_gradient(TensorInfo& t);
  // The parked gradient of `t`, back on the device (waits for the copy); its host bytes go.
  at::Tensor unpark_gradient(TensorInfo& t);

 private:
  bool hidden_under_forward(int64_t bytes) const;
  // Starts `t`'s copy to host; false if it cannot be copied (too small, a view, the host full).
  bool start_out(TensorInfo& t);
  void start_in(TensorInfo& t, at::Tensor device_bytes, bool prefetched);
  void account_host(int64_t delta);
  // Under memory.compress = "bf16", an fp32 value crosses the link (and waits on host) as bf16.
  bool crosses_narrow(const at::Tensor& value) const;
  void forget_prefetch(TensorInfo& t);

  SwapOptions options_;
  MemoryTimeline* timeline_ = nullptr;
  SwapStats stats_;
  std::vector<TensorInfo*> prefetching_;  // tensors whose copy back was started ahead of use, in order
  using Clock = std::chrono::steady_clock;
  Clock::time_point step_start_{};
  double last_forward_ms_ = -1;  // the last step's forward; -1: no step seen yet
  bool in_backward_ = false;
};

template <typename Allocate>
bool HostSwap::prefetch(TensorInfo& t, Allocate&& allocate) {
  if (t.resident() || t.host == nullptr || !t.on_host()) return true;
  if (t.host->in) return true;
  at::Tensor bytes = allocate(t.host->device_bytes);
  if (!bytes.defined()) return false;
  start_in(t, std::move(bytes), /*prefetched=*/true);
  return true;
}

}  // namespace ht

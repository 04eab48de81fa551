#pragma once
// memory.optimizer_state = "host": the optimizer state waits in host memory between optimizer
// steps, as ZeRO-Offload keeps it there, so that forward and backward have its bytes for
// activations (momentum alone is as large as the parameters; AdamW's two moments twice that).
// It crosses the host link (alloc/host_link.h) after each step and back before the next, whole
// storages at a time (after compaction, one block per dtype), and comes back with the same bits,
// sizes and strides. On a GPU the optimizer could step on host instead (CPU-Adam); on CPU ranks
// both ends are the same memory, and the copy is what the link charges.

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace ht {

class HostLink;

struct StateOffloadStats {
  int64_t bytes_out = 0, bytes_in = 0;  // crossed the link
  double wait_ms = 0;                   // the step waiting for those copies
};

class StateOffload {
 public:
  explicit StateOffload(std::shared_ptr<HostLink> link) : link_(std::move(link)) {}

  // After an optimizer step: the state of `params` to host memory (outside the arena), storage by
  // storage over the link, waiting for the copies. Nothing to do before the first step makes it.
  void to_host(torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& params);
  // Before one: the state back into new storages on `device` (the arena's, under a budget), if
  // it is on host.
  void to_device(torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& params, const at::Device& device);
  const StateOffloadStats& stats() const { return stats_; }

 private:
  // Each distinct storage of `tensors` into a new one made by `allocate(bytes)`, over the link in
  // `to_host`'s direction; the tensors rebuilt on the new storages.
  template <typename Allocate>
  std::vector<at::Tensor> move(const std::vector<at::Tensor>& tensors, bool to_host, Allocate&& allocate);

  std::shared_ptr<HostLink> link_;
  StateOffloadStats stats_;
  bool on_host_ = false;
};

}  // namespace ht

#include "training/dataset.h"

namespace ht {

TensorDataset::TensorDataset(at::Tensor inputs, at::Tensor targets)
    : inputs_(std::move(inputs)), targets_(std::move(targets)) {
  TORCH_INTERNAL_ASSERT(inputs_.size(0) == targets_.size(0), "inputs and targets differ in length");
}

Batch context_part(const Batch& batch, const ContextLayout& layout) {
  if (!layout.on()) return batch;
  return {layout.part_of(batch.input, 1), layout.part_of(batch.target, 1)};
}

Batch staged_for(const Batch& batch, at::Device device) {
  if (!device.is_cuda()) return batch;
  return {batch.input.pin_memory(), batch.target.pin_memory()};
}

at::Tensor on_device(const at::Tensor& staged, at::Device device) {
  // From pinned memory the copy is the copy engine's, and ATen's host allocator keeps the block
  // until it ends; from pageable memory (a caller that did not stage) it is staged before the call
  // returns. Either way the host goes on at once.
  return staged.to(device, /*non_blocking=*/true);
}

Batch TensorDataset::batch(const at::Tensor& indices) const {
  return {inputs_.index_select(0, indices), targets_.index_select(0, indices)};
}

Batch TensorDataset::slice(int64_t start, int64_t count) const {
  return {inputs_.narrow(0, start, count), targets_.narrow(0, start, count)};
}

}  // namespace ht

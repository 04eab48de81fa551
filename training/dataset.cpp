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

Batch TensorDataset::batch(const at::Tensor& indices) const {
  return {inputs_.index_select(0, indices), targets_.index_select(0, indices)};
}

Batch TensorDataset::slice(int64_t start, int64_t count) const {
  return {inputs_.narrow(0, start, count), targets_.narrow(0, start, count)};
}

}  // namespace ht

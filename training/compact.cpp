#include "training/compact.h"

#include "alloc/cpu_device_allocator.h"
#include "alloc/out_of_memory.h"

#include <ATen/ATen.h>

#include <map>

namespace ht {

std::vector<at::Tensor> copies_on_host(const std::vector<at::Tensor>& tensors) {
  HostAllocationScope host;  // outside the arena
  std::vector<at::Tensor> out;
  out.reserve(tensors.size());
  for (const at::Tensor& t : tensors) {
    at::Tensor copy = at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kCPU));
    copy.copy_(t);
    out.push_back(copy);
  }
  return out;
}

std::vector<at::Tensor> into_one_block(const std::vector<at::Tensor>& host, const at::Device& device) {
  std::map<at::ScalarType, int64_t> elements;
  for (const at::Tensor& t : host) {
    TORCH_CHECK(t.is_non_overlapping_and_dense(), "into_one_block: a tensor with gaps or overlaps");
    elements[t.scalar_type()] += t.numel();
  }
  std::map<at::ScalarType, at::Tensor> blocks;
  for (const auto& [dtype, n] : elements) blocks[dtype] = at::empty({n}, at::TensorOptions().dtype(dtype).device(device));
  std::map<at::ScalarType, int64_t> used;
  std::vector<at::Tensor> out;
  out.reserve(host.size());
  for (const at::Tensor& t : host) {
    at::Tensor slot = blocks[t.scalar_type()].as_strided(t.sizes(), t.strides(), used[t.scalar_type()]);
    slot.copy_(t);
    used[t.scalar_type()] += t.numel();
    out.push_back(slot);
  }
  return out;
}

std::vector<at::Tensor> back_on_device(const std::vector<at::Tensor>& host, const at::Device& device) {
  try {
    return into_one_block(host, device);
  } catch (const OutOfBudget&) {
    std::vector<at::Tensor> placed;
    for (const at::Tensor& t : host) placed.push_back(into_one_block({t}, device).front());
    return placed;
  }
}

}  // namespace ht

#pragma once
// State that lives across training steps (parameters, optimizer state) moved into one block per
// dtype, by way of host memory. Under a budget the arena keeps such memory at its top, apart from
// activations at its bottom (alloc/cpu_device_allocator.h); but tensors made one by one beside
// temporaries (weights converted to channels-last at build, momentum made lazily in the first
// optimizer step) leave holes among them when the temporaries go, and every hole is memory a
// large activation cannot use. Copied out first, the old blocks are freed before the new one is
// allocated, so it lands where they were: one piece at the top. Copies: the same bits.

#include <ATen/core/Tensor.h>

#include <vector>

namespace ht {

// Host copies of `tensors` (sizes and strides kept), outside the arena.
std::vector<at::Tensor> copies_on_host(const std::vector<at::Tensor>& tensors);
// `host` copied into one new block per dtype on `device`, in order, each with its sizes and
// strides: the tensors to use from now on. Throws what the allocator throws if the block does not fit.
std::vector<at::Tensor> into_one_block(const std::vector<at::Tensor>& host, const at::Device& device);
// into_one_block, or, where no one piece that large is free, each tensor back where it fits: state
// is never left on host. Throws only if even that does not fit.
std::vector<at::Tensor> back_on_device(const std::vector<at::Tensor>& host, const at::Device& device);

}  // namespace ht

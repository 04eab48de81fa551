#pragma once
// Every difference between the libtorch versions we build against lives here:
// Debian's libtorch 1.13 (CPU, CI) and libtorch 2.x (CUDA, the GPU machine).

#include <ATen/ATen.h>
#include <torch/version.h>

#include <cstring>

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
// libtorch 2.3 made c10::Allocator::allocate non-const and added a pure copy_data().
#define HT_ALLOCATE_CONST
#define HT_ALLOCATOR_COPY_DATA                                                      \
  void copy_data(void* dest, const void* src, std::size_t count) const override { \
    std::memcpy(dest, src, count);                                                \
  }
#else
#define HT_ALLOCATE_CONST const
#define HT_ALLOCATOR_COPY_DATA
#endif

#if TORCH_VERSION_MAJOR >= 2
// libtorch 2.0 can replace its CUDA allocator (torch/csrc/cuda/CUDAPluggableAllocator.h): what a
// budget on a GPU is built on (alloc/cuda_arena.h).
#define HT_CUDA_PLUGGABLE_ALLOCATOR 1
#endif

namespace ht::compat {

// A private generator for `device`, seeded with `seed`: random ops draw from it so that a
// recomputation replays exactly the same numbers without touching the global generator.
inline at::Generator seeded_generator(const at::Device& device, uint64_t seed) {
  at::Generator gen = at::globalContext().defaultGenerator(device).clone();
  gen.set_current_seed(seed);
  return gen;
}

}  // namespace ht::compat

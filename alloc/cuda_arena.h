#pragma once
// Device memory on a GPU. A budget there is the same arena as on a CPU rank (cpu_arena.h), over
// one cudaMalloc block of the budget's size. hybrid_train's allocator goes in front of ATen's CUDA
// caching allocator (libtorch 2.x's pluggable-allocator hook): inside a CudaArenaScope a request
// is served from the scope's arena by the same path as a CPU rank's (allocate_in_arena:
// placement by lifetime, a static layout's offsets, and an allocation that does not fit asks
// the memory manager to evict before it fails); outside one, ATen's caching allocator serves it
// as ever, so a run without a budget is PyTorch's own baseline. So a budget on a GPU keeps the CPU
// arena's guarantees: a real limit (nothing beyond the block, the workspaces kernels ask for
// included; only the libraries' per-process workspaces, made before an arena serves, are
// outside), fragmentation visible (the arena's own map), eviction on failure (inside the
// allocation, not after an exception). The caching allocator's own limit (setMemoryFraction)
// gives the first only: its cached blocks hide fragmentation, and its out-of-memory error leaves
// a kernel half run for the caller to repeat.
//
// An arena's freed blocks are reused at once when they were made on the device's default stream
// (the compute stream: its kernels run in order). A block made while another stream was ATen's
// current one (a collective's temporary on the communication stream) goes back only once an event
// recorded on that stream at its free has passed (alloc/deferred_frees.h); an allocation that
// finds no room waits those out first. Tensors another stream reads that were made on the compute
// stream are held by whoever queued the work until it is done (a collective's job,
// parallel/stream_collectives.h; a host link's copy, which holds its device end until the compute
// stream waits for it).
//
// Built where libtorch has CUDA (HT_TORCH_CUDA); elsewhere every function says so
// (no_cuda_arena.cpp). Checked in CI against libtorch 1.13's CUDA headers
// (cmake/HtCudaApiCheck.cmake); the 2.x hook compiles on the GPU machine only.

#include "alloc/cpu_arena.h"

#include <cstdint>
#include <memory>
#include <string>

namespace ht {

// Whether this build can hold memory.budget on a GPU: libtorch 2.x with CUDA.
bool cuda_budgets_built();
// Why not, in words, when cuda_budgets_built() is false.
std::string cuda_budgets_missing();
// Total memory of GPU `device` in bytes (what "60%" of the device means); -1 without CUDA.
int64_t cuda_device_memory_bytes(int device);
// The GPU as the driver names it ("NVIDIA H200"), "" without CUDA; its free memory now, -1
// without CUDA; how many GPUs this process sees (0 without CUDA).
std::string cuda_device_name(int device);
int64_t cuda_free_memory_bytes(int device);
int cuda_device_count();
// Gives the caching allocator's idle blocks back to the driver (after a measurement at start, so
// that the free memory read next is the job's); nothing without CUDA.
void release_cached_cuda_memory();
// GPU `device`'s UUID as hex ("" without CUDA): which physical GPU it is, whatever
// CUDA_VISIBLE_DEVICES numbers it.
std::string cuda_device_uuid(int device);

// Puts hybrid_train's allocator in front of ATen's CUDA caching allocator for the rest of the
// process. Must run before anything allocates on a GPU through ATen; later calls do nothing.
// Throws std::runtime_error when ATen allocated on a GPU first, or the build cannot.
void install_cuda_allocator();

// An arena over one cudaMalloc block of `bytes` on `device`, given back when the arena goes.
// Throws std::runtime_error naming the GPU's free memory when the block does not fit.
std::shared_ptr<CpuArena> make_cuda_arena(int64_t bytes, int device);

// While alive, CUDA tensors come from `arena` (install_cuda_allocator() first); active_arena()
// returns it. One device memory at a time per process: not beside an ArenaScope. Blocks freed
// after the scope still go back to their arena, which lives until its last block is freed.
class CudaArenaScope {
 public:
  explicit CudaArenaScope(std::shared_ptr<CpuArena> arena);
  ~CudaArenaScope();
  CudaArenaScope(const CudaArenaScope&) = delete;
  CudaArenaScope& operator=(const CudaArenaScope&) = delete;

 private:
  std::shared_ptr<CpuArena> arena_;
};

// Makes ATen's per-process GPU workspaces on `device` (cuBLAS's and cuBLASLt's, made by the first
// matrix product on a stream) now, from the caching allocator, outside any arena, and returns
// their bytes as the caching allocator counts them (measured at the first call for the device,
// which alone runs the products: 0 where a product ran before it). A CudaArenaScope calls it; a
// run without a budget calls it before measuring, and leaves those bytes out of its peak. -1
// without CUDA.
int64_t make_cuda_library_workspaces(int device);

// The caching allocator's peak of bytes in tensors on `device` (outside arenas) since the last
// reset: device memory of a run without a budget. -1 without CUDA.
int64_t cuda_allocated_peak_bytes(int device);
int64_t cuda_allocated_bytes(int device);  // now
void reset_cuda_allocated_peak(int device);

}  // namespace ht

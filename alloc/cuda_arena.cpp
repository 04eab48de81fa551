#include "alloc/cuda_arena.h"

#include <cstdio>

#include "alloc/arena_registry.h"
#include "alloc/cpu_device_allocator.h"
#include "alloc/cuda_fence.h"
#include "alloc/deferred_frees.h"
#include "base/compat.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#ifdef HT_CUDA_PLUGGABLE_ALLOCATOR
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>
#endif

#include <algorithm>
#include <atomic>
#include <exception>
#include <map>
#include <mutex>
#include <stdexcept>

namespace ht {
namespace {

std::string mib(int64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

// The arenas CUDA blocks may be in, and the active one (also in active_arena()).
ArenaRegistry& cuda_arenas() {
  static auto* registry = new ArenaRegistry();  // never destroyed: tensors are freed during exit too
  return *registry;
}
std::atomic<CpuArena*> g_cuda_active{nullptr};

// Blocks freed on the host while a stream other than the device's default (the compute stream)
// may still use them: a tensor made while a communication stream was ATen's current one
// (parallel/stream_collectives.h). They go back once an event recorded on that stream at the
// free has passed (alloc/deferred_frees.h), as PyTorch's caching allocator keeps a block its
// other streams use. The caching allocator's own blocks are kept too (it reuses a block only on
// its stream, but the arena's are the ones this is for).
[[maybe_unused]] DeferredFrees& side_stream_frees() {
  static auto* frees = new DeferredFrees();  // never destroyed: tensors are freed during exit too
  return *frees;
}

#ifdef HT_CUDA_PLUGGABLE_ALLOCATOR
namespace cca = c10::cuda::CUDACachingAllocator;
// ATen's own caching allocator, which serves every request outside an arena.
std::atomic<cca::CUDAAllocator*> g_native{nullptr};

// ATen's caching allocator, wherever the hook put it.
cca::CUDAAllocator* native_allocator() {
  cca::CUDAAllocator* native = g_native.load(std::memory_order_acquire);
  return native != nullptr ? native : cca::get();
}

void* allocate(size_t n, int, cudaStream_t stream) {
  side_stream_frees().reap();  // the caching allocator's blocks too, with no arena to reap them
  if (CpuArena* arena = g_cuda_active.load(std::memory_order_acquire)) return allocate_in_arena(*arena, n);
  // Never null, not even for zero bytes: the hook books blocks by pointer.
  return native_allocator()->raw_alloc_with_stream(std::max<size_t>(n, 1), stream);
}

void release_now(void* data) {
  if (release_to_arenas(cuda_arenas(), data) >= 0) return;
  native_allocator()->raw_delete(data);
}

void release(void* data, size_t, int device, cudaStream_t stream) {
  if (data == nullptr) return;
  if (stream != c10::cuda::getDefaultCUDAStream(static_cast<c10::DeviceIndex>(device)).stream()) {
    side_stream_frees().defer(std::make_shared<CudaFence>(stream), [data] { release_now(data); });
    return;
  }
  release_now(data);
}
#endif

// The caching allocator's statistics (its type differs between libtorch versions).
auto caching_allocator_stats(int device) {
#ifdef HT_CUDA_PLUGGABLE_ALLOCATOR
  return native_allocator()->getDeviceStats(device);
#else
  return c10::cuda::CUDACachingAllocator::getDeviceStats(device);
#endif
}

}  // namespace

// ATen keeps some GPU memory for the rest of the process: cuBLAS's and cuBLASLt's workspaces,
// made by the first matrix product on a stream. Made inside an arena they sit in that budget and
// keep the arena (its whole cudaMalloc block) alive past its scope. Seen on an H200 with libtorch
// 2.11 (2026-11-26): the first run in an arena held 1 MiB more after its steps than every run
// after it, and bench_dtr_budget's later arenas found the GPU full. So they are made from the
// caching allocator before the first arena on a device serves, and before a run without a budget
// measures its peak: per-process library state, outside every budget and every peak, as the CUDA
// context itself is.
int64_t make_cuda_library_workspaces(int device) {
  static std::mutex mu;
  static std::map<int, int64_t> made;  // device -> bytes, measured the first time
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = made.find(device); it != made.end()) return it->second;  // made: cached for the process
  TORCH_CHECK(active_arena() == nullptr, "make_cuda_library_workspaces: inside an arena");
  const int64_t before = caching_allocator_stats(device).allocated_bytes[0].current;
  {
    const auto on_gpu = at::TensorOptions().device(at::kCUDA, static_cast<c10::DeviceIndex>(device));
    for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
      const at::Tensor a = at::ones({16, 16}, on_gpu.dtype(dtype));
      const at::Tensor bias = at::ones({16}, on_gpu.dtype(dtype));
      at::mm(a, a);
      at::addmm(bias, a, a);  // cuBLASLt's path (a product with a bias) where ATen takes it
      at::addmm(a, a, a);
      at::bmm(a.unsqueeze(0), a.unsqueeze(0));
    }
  }
  const int64_t grown = caching_allocator_stats(device).allocated_bytes[0].current - before;
  return made.emplace(device, grown).first->second;
}

bool cuda_budgets_built() {
#ifdef HT_CUDA_PLUGGABLE_ALLOCATOR
  return true;
#else
  return false;
#endif
}

std::string cuda_budgets_missing() {
  return cuda_budgets_built() ? std::string()
                              : "budgets on CUDA need libtorch 2.0 or later (its pluggable CUDA allocator); this "
                                "build's libtorch is " TORCH_VERSION;
}

int64_t cuda_device_memory_bytes(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it for whoever asks next
    return -1;
  }
  return static_cast<int64_t>(prop.totalGlobalMem);
}

std::string cuda_device_name(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  return prop.name;
}

void release_cached_cuda_memory() {
#ifdef HT_CUDA_PLUGGABLE_ALLOCATOR
  native_allocator()->emptyCache();
#else
  c10::cuda::CUDACachingAllocator::emptyCache();
#endif
}

int64_t cuda_free_memory_bytes(int device) {
  int before = 0;
  size_t free = 0, total = 0;
  if (cudaGetDevice(&before) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  const bool read = cudaSetDevice(device) == cudaSuccess && cudaMemGetInfo(&free, &total) == cudaSuccess;
  if (!read) cudaGetLastError();
  cudaSetDevice(before);
  return read ? static_cast<int64_t>(free) : -1;
}

std::string cuda_device_uuid(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  std::string hex;
  char byte[3];
  for (char c : prop.uuid.bytes) {
    std::snprintf(byte, sizeof byte, "%02x", static_cast<unsigned char>(c));
    hex += byte;
  }
  return hex;
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

void install_cuda_allocator() {
#ifndef HT_CUDA_PLUGGABLE_ALLOCATOR
  throw std::runtime_error("install_cuda_allocator: " + cuda_budgets_missing());
#else
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (g_native.load() != nullptr) return;
  cca::CUDAAllocator* native = cca::get();
  static auto ours = torch::cuda::CUDAPluggableAllocator::createCustomAllocator(allocate, release);
  try {
    torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(ours);
  } catch (const c10::Error&) {
    throw std::runtime_error("install_cuda_allocator: ATen allocated on a GPU before hybrid_train's allocator was "
                             "installed; it must come first");
  }
  c10::SetAllocator(c10::DeviceType::CUDA, ours.get(), /*priority=*/1);
  set_deferred_frees(&side_stream_frees());
  // The hook replaced it before its first use, so nothing initialized it: we do, as ATen would.
  native->init(c10::cuda::device_count());
  g_native.store(native, std::memory_order_release);
#endif
}

std::shared_ptr<CpuArena> make_cuda_arena(int64_t bytes, int device) {
  const std::string what = mib(bytes) + " on cuda:" + std::to_string(device);
  if (cudaSetDevice(device) != cudaSuccess) {
    throw std::runtime_error("device memory of " + what + ": cannot select the GPU: " +
                             cudaGetErrorString(cudaGetLastError()));
  }
  void* base = nullptr;
  cudaError_t status = cudaMalloc(&base, static_cast<size_t>(bytes));
#ifdef HT_CUDA_PLUGGABLE_ALLOCATOR
  if (status == cudaErrorMemoryAllocation) {  // the caching allocator's idle blocks may be in the way
    cudaGetLastError();
    side_stream_frees().drain();  // and blocks that keep an ended arena alive only for a side stream
    native_allocator()->emptyCache();
    status = cudaMalloc(&base, static_cast<size_t>(bytes));
  }
#endif
  if (status != cudaSuccess) {
    cudaGetLastError();
    size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    const ArenaRegistry::Held held = cuda_arenas().retired_but_held();
    throw std::runtime_error("device memory of " + what + ": cudaMalloc failed (" + cudaGetErrorString(status) +
                             "); the GPU has " + mib(static_cast<int64_t>(free)) + " free of " +
                             mib(static_cast<int64_t>(total)) +
                             (held.arenas == 0 ? std::string()
                                               : "; " + std::to_string(held.arenas) + " ended arenas (" +
                                                     mib(held.capacity) + ") are kept by " + mib(held.in_use) +
                                                     " of tensors still alive"));
  }
  return std::make_shared<CpuArena>(base, bytes, [](void* p) { cudaFree(p); });
}

CudaArenaScope::CudaArenaScope(std::shared_ptr<CpuArena> arena) : arena_(std::move(arena)) {
  TORCH_CHECK(arena_ != nullptr, "CudaArenaScope: no arena");
  TORCH_CHECK(cuda_budgets_built(), "CudaArenaScope: ", cuda_budgets_missing());
  TORCH_CHECK(active_arena() == nullptr, "CudaArenaScope: another arena is already active (one device memory per process)");
  install_cuda_allocator();
  make_cuda_library_workspaces(c10::cuda::current_device());  // outside the arena: they outlive it
  cuda_arenas().add(arena_);
  g_cuda_active.store(arena_.get(), std::memory_order_release);
  set_cuda_arena(arena_.get());
}

CudaArenaScope::~CudaArenaScope() {
  // The arena ends with no block kept for a side stream; while an exception unwinds only those
  // already passed go (a side stream's collective may never be matched: the rank is failing).
  if (std::uncaught_exceptions() == 0) {
    side_stream_frees().drain();
  } else {
    side_stream_frees().reap();
  }
  set_cuda_arena(nullptr);
  g_cuda_active.store(nullptr, std::memory_order_release);
  cuda_arenas().retire(arena_.get());
}

int64_t cuda_allocated_peak_bytes(int device) {
  return caching_allocator_stats(device).allocated_bytes[0].peak;  // [0]: StatType::AGGREGATE
}

int64_t cuda_allocated_bytes(int device) { return caching_allocator_stats(device).allocated_bytes[0].current; }

void reset_cuda_allocated_peak(int device) {
#ifdef HT_CUDA_PLUGGABLE_ALLOCATOR
  native_allocator()->resetPeakStats(device);
#else
  c10::cuda::CUDACachingAllocator::resetPeakStats(device);
#endif
}

}  // namespace ht

#include "alloc/cuda_arena.h"
#include "alloc/cuda_host_link.h"

#include <stdexcept>

// A build whose libtorch has no CUDA (alloc/CMakeLists.txt): the config refuses budgets on GPUs
// with cuda_budgets_missing(), so nothing here that throws is reached from a job.

namespace ht {

bool cuda_budgets_built() { return false; }

std::string cuda_budgets_missing() {
  return "this build's libtorch has no CUDA; build against a CUDA libtorch (scripts/device-build.sh)";
}

int64_t cuda_device_memory_bytes(int) { return -1; }
std::string cuda_device_name(int) { return ""; }
int64_t cuda_free_memory_bytes(int) { return -1; }
int cuda_device_count() { return 0; }
void release_cached_cuda_memory() {}
std::string cuda_device_uuid(int) { return ""; }

void install_cuda_allocator() { throw std::runtime_error("install_cuda_allocator: " + cuda_budgets_missing()); }

std::shared_ptr<CpuArena> make_cuda_arena(int64_t, int) {
  throw std::runtime_error("make_cuda_arena: " + cuda_budgets_missing());
}

CudaArenaScope::CudaArenaScope(std::shared_ptr<CpuArena>) {
  throw std::runtime_error("CudaArenaScope: " + cuda_budgets_missing());
}
CudaArenaScope::~CudaArenaScope() = default;

std::shared_ptr<HostLink> make_cuda_host_link(int, double) {
  throw std::runtime_error("make_cuda_host_link: " + cuda_budgets_missing());
}

double cuda_host_link_gbps(int) { throw std::runtime_error("cuda_host_link_gbps: " + cuda_budgets_missing()); }

int64_t make_cuda_library_workspaces(int) { return -1; }
int64_t cuda_allocated_peak_bytes(int) { return -1; }
int64_t cuda_allocated_bytes(int) { return -1; }
void reset_cuda_allocated_peak(int) {}

}  // namespace ht

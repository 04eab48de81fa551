#include "runtime/kernel_timer.h"

#include <ATen/cuda/CUDAEvent.h>

// Built where libtorch has CUDA (runtime/CMakeLists.txt); compiled, not linked, against
// libtorch 1.13's CUDA headers in CI (cmake/HtCudaApiCheck.cmake).

namespace ht {
namespace {

class CudaKernelTime final : public DeviceKernelTime {
 public:
  void record_start() override { start_.record(); }  // ATen's current stream on the current device
  void record_end() override { end_.record(); }
  double ms() override {
    end_.synchronize();
    return static_cast<double>(start_.elapsed_time(end_));
  }

 private:
  // cudaEventDefault: with timing (ATen's default flag disables it).
  at::cuda::CUDAEvent start_{cudaEventDefault};
  at::cuda::CUDAEvent end_{cudaEventDefault};
};

}  // namespace

std::shared_ptr<DeviceKernelTime> make_cuda_kernel_time() { return std::make_shared<CudaKernelTime>(); }

}  // namespace ht

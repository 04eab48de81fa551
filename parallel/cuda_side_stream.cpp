#include "parallel/cuda_side_stream.h"

#include "alloc/cuda_fence.h"

#include <cuda_runtime_api.h>

#ifdef HT_TORCH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <string>

namespace ht {
namespace {

#ifdef HT_TORCH_CUDA
class CudaSideStream final : public SideStream {
 public:
  CudaSideStream(int device, cudaStream_t side, cudaEvent_t ready) : device_(device), side_(side), ready_(ready) {}
  void follow_compute() override {
    cudaSetDevice(device_);
    if (cudaEventRecord(ready_, current_cuda_stream(device_)) != cudaSuccess ||
        cudaStreamWaitEvent(side_, ready_, 0) != cudaSuccess) {
      throw CommunicationError(std::string("the communication stream behind the compute stream: ") +
                               cudaGetErrorString(cudaGetLastError()));
    }
  }
  std::shared_ptr<void> enter() override {
    return std::make_shared<c10::cuda::CUDAStreamGuard>(
        c10::cuda::getStreamFromExternal(side_, static_cast<c10::DeviceIndex>(device_)));
  }
  std::shared_ptr<Fence> record() override { return std::make_shared<CudaFence>(side_); }
  void compute_waits(Fence& fence) override {
    const cudaEvent_t event = static_cast<CudaFence&>(fence).event;
    if (event != nullptr && cudaStreamWaitEvent(current_cuda_stream(device_), event, 0) != cudaSuccess) {
      throw CommunicationError(std::string("the compute stream behind the communication stream: ") +
                               cudaGetErrorString(cudaGetLastError()));
    }
  }

 private:
  int device_;
  cudaStream_t side_;
  cudaEvent_t ready_;
};
#endif

}  // namespace

cudaStream_t current_cuda_stream(int device) {
#ifdef HT_TORCH_CUDA
  return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
#else
  (void)device;
  return nullptr;
#endif
}

std::shared_ptr<SideStream> make_cuda_side_stream(int device, cudaStream_t side, cudaEvent_t ready) {
#ifdef HT_TORCH_CUDA
  return std::make_shared<CudaSideStream>(device, side, ready);
#else
  (void)device, (void)side, (void)ready;
  return nullptr;
#endif
}

}  // namespace ht

#include "parallel/cuda_side_stream.h"

#include <cuda_runtime_api.h>

#ifdef HT_TORCH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <string>

namespace ht {
namespace {

// A point on a stream: an event of its own, recorded there. Never throws: without an event the
// host waits for the stream, and the fence has passed (a job's tensors may then go at once).
class EventFence final : public Fence {
 public:
  explicit EventFence(cudaStream_t stream) {
    if (cudaEventCreateWithFlags(&event, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventRecord(event, stream) != cudaSuccess) {
      cudaGetLastError();
      if (event != nullptr) cudaEventDestroy(event);
      event = nullptr;
      cudaStreamSynchronize(stream);
    }
  }
  ~EventFence() override {
    if (event != nullptr) cudaEventDestroy(event);
  }
  bool passed() override { return event == nullptr || cudaEventQuery(event) != cudaErrorNotReady; }
  void wait() override {
    if (event != nullptr) cudaEventSynchronize(event);
  }
  cudaEvent_t event = nullptr;
};

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
  std::shared_ptr<Fence> record() override { return std::make_shared<EventFence>(side_); }
  void compute_waits(Fence& fence) override {
    const cudaEvent_t event = static_cast<EventFence&>(fence).event;
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

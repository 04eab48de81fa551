#pragma once
// A point on a CUDA stream (alloc/deferred_frees.h's Fence): an event of its own, recorded there.
// Never throws (a deleter makes them): without an event the host waits for the stream, and the
// fence has passed. For CUDA sources only (the arena's deferred frees, the communication stream).

#include "alloc/deferred_frees.h"

#include <cuda_runtime_api.h>

namespace ht {

class CudaFence final : public Fence {
 public:
  explicit CudaFence(cudaStream_t stream) {
    if (cudaEventCreateWithFlags(&event, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventRecord(event, stream) != cudaSuccess) {
      cudaGetLastError();
      if (event != nullptr) cudaEventDestroy(event);
      event = nullptr;
      cudaStreamSynchronize(stream);
    }
  }
  ~CudaFence() override {
    if (event != nullptr) cudaEventDestroy(event);
  }
  CudaFence(const CudaFence&) = delete;
  CudaFence& operator=(const CudaFence&) = delete;
  bool passed() override { return event == nullptr || cudaEventQuery(event) != cudaErrorNotReady; }
  void wait() override {
    if (event != nullptr) cudaEventSynchronize(event);
  }
  cudaEvent_t event = nullptr;  // null: the stream was waited for
};

}  // namespace ht

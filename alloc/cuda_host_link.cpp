#include "alloc/cuda_host_link.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>

namespace ht {
namespace {

using Clock = std::chrono::steady_clock;

void check_cuda(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw std::runtime_error(std::string("the CUDA host link: ") + what + ": " + cudaGetErrorString(rc));
}

cudaStream_t compute_stream(int device) {
  return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
}

// One copy on a copy stream: done once its event has passed; its ends held until then.
class CudaCopy final : public CopyJob {
 public:
  CudaCopy(CopyDirection direction, int64_t bytes, bool convert, at::Tensor src, at::Tensor dst, int device)
      : CopyJob(direction, bytes, convert), src_(std::move(src)), dst_(std::move(dst)), device_(device),
        started_(Clock::now()) {
    check_cuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "an event");
  }
  ~CudaCopy() override {
    if (!finished_) cudaEventSynchronize(event_);  // its ends are freed with it: never under the copy
    cudaEventDestroy(event_);
  }
  cudaEvent_t event() const { return event_; }

  bool done() const override {
    if (finished_) return true;
    const cudaError_t status = cudaEventQuery(event_);
    if (status == cudaErrorNotReady) return false;
    check_cuda(status, "a copy");
    finished_ = true;
    finished_at_ = Clock::now();
    src_ = at::Tensor();  // the ends go back to whoever else holds them, on this (the caller's) thread
    dst_ = at::Tensor();
    return true;
  }
  double wait() override {
    if (done()) return 0;
    check_cuda(cudaStreamWaitEvent(compute_stream(device_), event_, 0), "the compute stream's wait for a copy");
    // The device end may go back now: whatever the compute stream does with its block runs behind
    // the copy, and a later copy starts behind the compute stream. The host end stays held.
    (direction == CopyDirection::kToHost ? src_ : dst_) = at::Tensor();
    return 1e-3;  // the compute stream waits for it: the copy was not hidden (the host does not wait)
  }
  double finish() override {
    if (done()) return 0;
    const Clock::time_point start = Clock::now();
    check_cuda(cudaEventSynchronize(event_), "a copy");
    done();
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  }
  Clock::time_point started() const override { return started_; }
  Clock::time_point finished() const override {
    done();
    return finished_ ? finished_at_ : Clock::now();
  }

 private:
  mutable at::Tensor src_, dst_;
  int device_;
  cudaEvent_t event_ = nullptr;
  Clock::time_point started_;
  mutable Clock::time_point finished_at_;
  mutable bool finished_ = false;
};

// 64 MiB each way between pinned host memory and GPU `device`, timed by events on a stream of its
// own: the slower direction, GB/s; throws where its memory cannot be had.
double measure_link(int device) {
  constexpr int64_t kBytes = int64_t{64} << 20;
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "the link's measurement");
  void* on_device = nullptr;
  void* host = nullptr;
  check_cuda(cudaMalloc(&on_device, kBytes), "the link's measurement");
  if (cudaMallocHost(&host, kBytes) != cudaSuccess) {
    cudaFree(on_device);
    cudaStreamDestroy(stream);
    check_cuda(cudaGetLastError(), "the link's measurement");
    return 0;
  }
  cudaEvent_t begin, end;
  cudaEventCreate(&begin);
  cudaEventCreate(&end);
  double slowest_ms = 0;
  for (cudaMemcpyKind kind : {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost}) {
    float best = 1e30f;
    for (int rep = 0; rep < 3; ++rep) {
      cudaEventRecord(begin, stream);
      cudaMemcpyAsync(kind == cudaMemcpyHostToDevice ? on_device : host,
                      kind == cudaMemcpyHostToDevice ? host : on_device,
                      kBytes, kind, stream);
      cudaEventRecord(end, stream);
      cudaEventSynchronize(end);
      float ms = 0;
      cudaEventElapsedTime(&ms, begin, end);
      best = std::min(best, ms);
    }
    slowest_ms = std::max(slowest_ms, static_cast<double>(best));
  }
  cudaEventDestroy(begin);
  cudaEventDestroy(end);
  cudaFreeHost(host);
  cudaFree(on_device);
  cudaStreamDestroy(stream);
  return static_cast<double>(kBytes) / (std::max(slowest_ms, 1e-3) * 1e6);
}

class CudaHostLink final : public HostLink {
 public:
  CudaHostLink(int device, double gbps) : device_(device) {
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    for (int d = 0; d < 2; ++d) {
      check_cuda(cudaStreamCreateWithFlags(&streams_[d], cudaStreamNonBlocking), "a copy stream");
    }
    check_cuda(cudaEventCreateWithFlags(&written_, cudaEventDisableTiming), "an event");
    gbps_ = gbps > 0 ? gbps : cuda_host_link_gbps(device_);
  }
  ~CudaHostLink() override {
    jobs_[0].clear();
    jobs_[1].clear();  // each waits for its copy
    for (Staging& s : staging_) {
      if (s.data != nullptr) cudaFree(s.data);
    }
    cudaEventDestroy(written_);
    for (cudaStream_t s : streams_) cudaStreamDestroy(s);
  }

  double gbps() const override { return gbps_; }
  at::Tensor host_empty(int64_t elements, at::ScalarType dtype) override {
    return at::empty({elements}, at::TensorOptions().dtype(dtype).pinned_memory(true));
  }

  std::shared_ptr<CopyJob> copy(CopyDirection direction, const at::Tensor& src, const at::Tensor& dst) override {
    const int64_t bytes = checked_copy_bytes(src, dst);
    auto job = start(direction, src, dst, bytes, false);
    check_cuda(cudaMemcpyAsync(dst.data_ptr(), src.storage().data(), static_cast<size_t>(bytes), cudaMemcpyDefault,
                               stream(direction)),
               "a copy");
    return finish(direction, job);
  }

  std::shared_ptr<CopyJob> convert(CopyDirection direction, const at::Tensor& src, const at::Tensor& dst) override {
    const int64_t bytes = checked_convert_bytes(src, dst);
    auto job = start(direction, src, dst, bytes, true);
    // The narrow type's bytes cross; the conversion is a kernel on the copy stream, on the device.
    const bool out = direction == CopyDirection::kToHost;
    const at::ScalarType narrow = out ? dst.scalar_type() : src.scalar_type();
    at::Tensor staged = staging(direction, src.numel(), narrow);
    {
      const c10::cuda::CUDAStreamGuard guard(c10::cuda::getStreamFromExternal(stream(direction),
                                                                               static_cast<c10::DeviceIndex>(device_)));
      if (out) {
        staged.copy_(src);
        check_cuda(cudaMemcpyAsync(dst.data_ptr(), staged.data_ptr(), static_cast<size_t>(bytes), cudaMemcpyDefault,
                                   stream(direction)),
                   "a copy");
      } else {
        check_cuda(cudaMemcpyAsync(staged.data_ptr(), src.data_ptr(), static_cast<size_t>(bytes), cudaMemcpyDefault,
                                   stream(direction)),
                   "a copy");
        const_cast<at::Tensor&>(dst).copy_(staged);
      }
    }
    return finish(direction, job);
  }

  double backlog_ms(CopyDirection direction) const override {
    int64_t bytes = 0;
    for (const auto& job : jobs_[index(direction)]) {
      if (!job->done()) bytes += job->bytes;
    }
    return transfer_ms(bytes);
  }
  LinkStats stats(CopyDirection direction) const override { return stats_[index(direction)]; }

 private:
  struct Staging {
    void* data = nullptr;
    size_t bytes = 0;
  };
  static int index(CopyDirection d) { return d == CopyDirection::kToHost ? 0 : 1; }
  cudaStream_t stream(CopyDirection d) const { return streams_[index(d)]; }

  // The copy waits for what the compute stream has queued so far (its source's last writer).
  std::shared_ptr<CudaCopy> start(CopyDirection direction, const at::Tensor& src, const at::Tensor& dst, int64_t bytes,
                                  bool convert) {
    reap();
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    check_cuda(cudaEventRecord(written_, compute_stream(device_)), "an event on the compute stream");
    check_cuda(cudaStreamWaitEvent(stream(direction), written_, 0), "a copy stream's wait");
    return std::make_shared<CudaCopy>(direction, bytes, convert, src, dst, device_);
  }

  std::shared_ptr<CopyJob> finish(CopyDirection direction, const std::shared_ptr<CudaCopy>& job) {
    check_cuda(cudaEventRecord(job->event(), stream(direction)), "an event on a copy stream");
    jobs_[index(direction)].push_back(job);
    LinkStats& s = stats_[index(direction)];
    ++s.copies;
    s.bytes += job->bytes;
    s.busy_ms += transfer_ms(job->bytes);
    return job;
  }

  // Copies done are let go of here (the caller's thread), oldest first, as the stream ran them.
  void reap() {
    for (auto& jobs : jobs_) {
      while (!jobs.empty() && jobs.front()->done()) jobs.pop_front();
    }
  }

  // The direction's staging buffer as `elements` of `dtype` on the device. A larger one replaces
  // it after the copy stream has finished with it (cudaFree waits for the device).
  at::Tensor staging(CopyDirection direction, int64_t elements, at::ScalarType dtype) {
    Staging& s = staging_[index(direction)];
    const size_t bytes = static_cast<size_t>(elements) * c10::elementSize(dtype);
    if (bytes > s.bytes) {
      check_cuda(cudaStreamSynchronize(stream(direction)), "a copy stream");  // the old buffer's last copy
      if (s.data != nullptr) check_cuda(cudaFree(s.data), "freeing a staging buffer");
      s.data = nullptr;
      check_cuda(cudaMalloc(&s.data, bytes), "a staging buffer");
      s.bytes = bytes;
    }
    return at::from_blob(s.data, {elements}, at::TensorOptions().dtype(dtype).device(at::kCUDA, device_));
  }

  int device_;
  double gbps_ = 0;
  cudaStream_t streams_[2] = {nullptr, nullptr};
  cudaEvent_t written_ = nullptr;
  Staging staging_[2];
  mutable std::deque<std::shared_ptr<CudaCopy>> jobs_[2];
  LinkStats stats_[2];
};

}  // namespace

double cuda_host_link_gbps(int device) {
  static std::mutex mu;
  static std::map<int, double> measured;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = measured.find(device); it != measured.end()) return it->second;
  return measured.emplace(device, measure_link(device)).first->second;
}

std::shared_ptr<HostLink> make_cuda_host_link(int device, double gbps) {
  return std::make_shared<CudaHostLink>(device, gbps);
}

}  // namespace ht

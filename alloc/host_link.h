#pragma once
// The link between device memory and host memory, as host swap uses it (memory.policy = "swap"
// or "hybrid", per-block offload, the optimizer state on host): an interface (HostLink) with
// one copy queue each way, as a GPU has one copy engine (stream) each way over a full-duplex
// PCIe link. ModelledHostLink is CPU ranks' (below); the CUDA link is alloc/cuda_host_link.h.
//
// On CPU ranks the device is the arena and the host is memory outside it. The link is a clock
// of its own: a copy starts when the one before it in its direction has finished (or when it is
// asked for, if the link is idle) and takes bytes / memory.host_link_gbps; a worker moves the
// bytes (memcpy) meanwhile, and a copy is done once both the bytes have moved and its modelled
// time has passed. So a swap costs on a workstation, and in every test, what it would cost over
// PCIe, and the part of it that runs beside compute is hidden as it would be on a GPU; and the
// link's time is exact, not inflated by how late a sleeping thread wakes up.
//
// Nothing here touches the allocator: the caller allocates both ends (the device end in the
// arena, the host end outside it) on its own thread and hands them over; a job holds both until
// it is done, so neither can be freed under the copy.

#include <ATen/core/Tensor.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

namespace ht {

enum class CopyDirection : uint8_t { kToHost, kToDevice };

// One copy, from the caller's side. Times are on the steady clock.
class CopyJob {
 public:
  CopyJob(CopyDirection direction, int64_t bytes, bool convert)
      : direction(direction), bytes(bytes), convert(convert) {}
  virtual ~CopyJob() = default;
  CopyJob(const CopyJob&) = delete;
  CopyJob& operator=(const CopyJob&) = delete;

  const CopyDirection direction;
  const int64_t bytes;   // what crosses the link
  const bool convert;    // dst.copy_(src) between dtypes, not a memcpy of src's storage

  // Whether the copy has finished: its ends may be freed or reused by anyone.
  virtual bool done() const = 0;
  // Until what this rank computes next may read the destination and overwrite the source: on CPU
  // ranks, until the copy is done; on a GPU, the compute stream waits for the copy's event and the
  // host goes on (a block the compute stream frees after this is reused only behind the copy).
  // Returns how long the host waited, ms (0 if it did not).
  virtual double wait() = 0;
  // Until the copy is done, on the host too: what a drop that needs the host copy valid (an
  // eviction, a read of the host end) waits for. On CPU ranks the same as wait().
  virtual double finish() { return wait(); }
  // When the link starts and finishes it (modelled on CPU ranks, as queued on a GPU: a GPU's
  // start is when it was queued, its finish when wait() or done() first saw it done).
  virtual std::chrono::steady_clock::time_point started() const = 0;
  virtual std::chrono::steady_clock::time_point finished() const = 0;
};

// A copy over the modelled link of CPU ranks (ModelledHostLink).
class ModelledCopy final : public CopyJob {
 public:
  ModelledCopy(CopyDirection direction, at::Tensor src, at::Tensor dst, int64_t bytes, bool convert = false)
      : CopyJob(direction, bytes, convert), src_(std::move(src)), dst_(std::move(dst)) {}
  bool done() const override;
  double wait() override;
  std::chrono::steady_clock::time_point started() const override;
  std::chrono::steady_clock::time_point finished() const override;

 private:
  friend class CopyQueue;
  at::Tensor src_, dst_;  // held until done: the caller may drop its own references
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  bool copied_ = false;  // the bytes have moved
  std::chrono::steady_clock::time_point started_, finished_;
};

struct LinkStats {
  int64_t copies = 0;
  int64_t bytes = 0;
  double busy_ms = 0;    // the link's time on copies (modelled)
  double memcpy_ms = 0;  // the workers' time moving the bytes
  double late_ms = 0;    // how far the bytes moved after their modelled end (a busy host's workers)
};

// One direction: a queue and its worker.
class CopyQueue {
 public:
  // `bytes_per_ms`: the modelled rate; <= 0: as fast as memcpy.
  explicit CopyQueue(double bytes_per_ms);
  ~CopyQueue();  // finishes what was queued, and waits out its modelled time
  CopyQueue(const CopyQueue&) = delete;
  CopyQueue& operator=(const CopyQueue&) = delete;

  void push(const std::shared_ptr<ModelledCopy>& job);
  // The modelled time (ms) until everything queued now is done: what a new copy waits for.
  double backlog_ms() const;
  LinkStats stats() const;

 private:
  void run();

  const double bytes_per_ms_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<ModelledCopy>> queue_;
  std::chrono::steady_clock::time_point free_at_{};  // when the last copy asked for finishes
  bool stopping_ = false;
  LinkStats stats_;
  std::thread worker_;
};

// The link host swap, per-block offload and the optimizer state on host copy over. A rank has
// one: ModelledHostLink on CPU ranks, the CUDA link on a GPU (make_cuda_host_link,
// alloc/cuda_host_link.h), and tests put a link of their own in its place.
class HostLink {
 public:
  virtual ~HostLink() = default;
  // The bandwidth of each direction, GB/s (10^9 bytes): modelled on CPU ranks (<= 0: memcpy's),
  // measured at start on a GPU. What the planner and the swap's rule price copies by.
  virtual double gbps() const = 0;
  // Memory on the host for a copy's host end (pinned on a GPU, where the copy engine reads it).
  virtual at::Tensor host_empty(int64_t elements, at::ScalarType dtype) = 0;
  // Copies the bytes of `src`'s whole storage into `dst` (a contiguous tensor of its own storage,
  // as large or larger), in `direction`'s queue, behind what this rank computed before the call.
  virtual std::shared_ptr<CopyJob> copy(CopyDirection direction, const at::Tensor& src, const at::Tensor& dst) = 0;
  // Copies `src` into `dst` (contiguous, as many elements, another floating type: memory.compress's
  // fp32 activations crossing as bf16); the link carries the narrower type's bytes.
  virtual std::shared_ptr<CopyJob> convert(CopyDirection direction, const at::Tensor& src, const at::Tensor& dst) = 0;
  // The time (ms) until everything queued now in `direction` is done: what a new copy waits for.
  virtual double backlog_ms(CopyDirection direction) const = 0;
  // The time of `bytes` alone on the link, ms.
  double transfer_ms(int64_t bytes) const {
    return gbps() > 0 ? static_cast<double>(bytes) / (gbps() * 1e6) : 0;
  }
  virtual LinkStats stats(CopyDirection direction) const = 0;
};

// Checks a copy's ends (HostLink::copy, ::convert); throws naming the call.
int64_t checked_copy_bytes(const at::Tensor& src, const at::Tensor& dst);
int64_t checked_convert_bytes(const at::Tensor& src, const at::Tensor& dst);

// CPU ranks' link: one copy queue each way, each with its own worker thread.
class ModelledHostLink final : public HostLink {
 public:
  // `gbps`: the modelled bandwidth of each direction, GB/s (10^9 bytes); <= 0: memcpy's.
  explicit ModelledHostLink(double gbps);
  double gbps() const override { return gbps_; }
  at::Tensor host_empty(int64_t elements, at::ScalarType dtype) override;
  std::shared_ptr<CopyJob> copy(CopyDirection direction, const at::Tensor& src, const at::Tensor& dst) override;
  // Here the worker converts as it copies; on a GPU the conversion is a kernel on the copy stream.
  std::shared_ptr<CopyJob> convert(CopyDirection direction, const at::Tensor& src, const at::Tensor& dst) override;
  double backlog_ms(CopyDirection direction) const override { return queue(direction).backlog_ms(); }
  LinkStats stats(CopyDirection direction) const override { return queue(direction).stats(); }

 private:
  const CopyQueue& queue(CopyDirection d) const { return d == CopyDirection::kToHost ? to_host_ : to_device_; }
  CopyQueue& queue(CopyDirection d) { return d == CopyDirection::kToHost ? to_host_ : to_device_; }

  double gbps_;
  CopyQueue to_host_, to_device_;
};

// memcpy's bandwidth on this machine, GB/s, from copying `bytes` a few times (what the start of a
// swapping run prints beside the modelled rate).
double measure_memcpy_gbps(int64_t bytes = 64 << 20);

}  // namespace ht

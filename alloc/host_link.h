#pragma once
// The link between device memory and host memory, as host swap uses it (memory.policy = "swap"
// or "hybrid"): one copy queue each way, each with its own worker thread, as a GPU has one copy
// engine (stream) each way over a full-duplex PCIe link.
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
  CopyJob(CopyDirection direction, at::Tensor src, at::Tensor dst, int64_t bytes, bool convert = false)
      : direction(direction), bytes(bytes), convert(convert), src_(std::move(src)), dst_(std::move(dst)) {}

  const CopyDirection direction;
  const int64_t bytes;   // what crosses the link
  const bool convert;    // dst.copy_(src) between dtypes, not a memcpy of src's storage

  bool done() const;
  // Blocks until the copy is done; returns how long it waited, ms (0 if it was done).
  double wait();
  // When the link starts and finishes it (the modelled times). A copy whose bytes moved later
  // than that (the worker was late) is done when they have.
  std::chrono::steady_clock::time_point started() const;
  std::chrono::steady_clock::time_point finished() const;

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

  void push(const std::shared_ptr<CopyJob>& job);
  // The modelled time (ms) until everything queued now is done: what a new copy waits for.
  double backlog_ms() const;
  LinkStats stats() const;

 private:
  void run();

  const double bytes_per_ms_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<CopyJob>> queue_;
  std::chrono::steady_clock::time_point free_at_{};  // when the last copy asked for finishes
  bool stopping_ = false;
  LinkStats stats_;
  std::thread worker_;
};

class HostLink {
 public:
  // `gbps`: the modelled bandwidth of each direction, GB/s (10^9 bytes); <= 0: memcpy's.
  explicit HostLink(double gbps);
  double gbps() const { return gbps_; }

  // Copies the bytes of `src`'s whole storage into `dst` (a contiguous tensor of its own storage,
  // as large or larger), on `direction`'s worker.
  std::shared_ptr<CopyJob> copy(CopyDirection direction, const at::Tensor& src, const at::Tensor& dst);
  // Copies `src` into `dst` (contiguous, as many elements, another floating type: memory.compress's
  // fp32 activations crossing as bf16); the link carries the narrower type's bytes. On a GPU the
  // conversion is a kernel beside the copy engine's transfer; here the worker converts as it copies.
  std::shared_ptr<CopyJob> convert(CopyDirection direction, const at::Tensor& src, const at::Tensor& dst);
  double backlog_ms(CopyDirection direction) const { return queue(direction).backlog_ms(); }
  // The modelled time of `bytes` alone on the link, ms.
  double transfer_ms(int64_t bytes) const;
  LinkStats stats(CopyDirection direction) const { return queue(direction).stats(); }

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

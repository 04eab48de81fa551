#pragma once
// What a memory trace (`memory.trace`) records, in trace-event terms: every kernel as a span
// (recomputations in their own category), every eviction, allocation and free as an instant,
// and a counter of device bytes in use after each allocation and free. Opens in chrome://tracing
// or Perfetto. Records only while recording() (the trainer turns it on for the first steps).

#include "alloc/cpu_device_allocator.h"
#include "alloc/memory_trace.h"

#include <atomic>
#include <chrono>
#include <string>

namespace ht {

class CpuArena;

class MemoryTimeline final : public AllocationObserver {
 public:
  // `arena` (may be null) is sampled for the bytes-in-use counter.
  MemoryTimeline(const std::string& path, const CpuArena* arena);
  ~MemoryTimeline() override;

  void set_recording(bool on) { recording_.store(on, std::memory_order_release); }
  bool recording() const { return recording_.load(std::memory_order_acquire); }

  void kernel(const char* op, bool recompute, double ms);  // a kernel that just ended
  void evicted(const char* op, uint64_t tensor_id, int64_t bytes);
  void marker(const std::string& name);                    // e.g. "step 3"
  // Host swap: a copy between device and host that ran from `start` to `end` (on tracks 2 for
  // copies out and 3 for copies in, beside compute), and compute waiting `ms` for one.
  void copy(bool to_host, uint64_t tensor_id, int64_t bytes, std::chrono::steady_clock::time_point start,
            std::chrono::steady_clock::time_point end);
  void copy_wait(uint64_t tensor_id, double ms);
  void on_allocated(const void* data, int64_t bytes) override;
  void on_freed(const void* data, int64_t bytes) override;

  // Finishes the file under its final name.
  void close() { trace_.close(); }
  const std::string& path() const { return trace_.path(); }

 private:
  double now_us() const;
  void sample_in_use(double ts);

  MemoryTrace trace_;
  const CpuArena* arena_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::atomic<bool> recording_{false};
};

}  // namespace ht

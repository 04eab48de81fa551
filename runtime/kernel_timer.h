#pragma once
// How long a kernel took. On the CPU, the host's clock around it. On a GPU the host returns once
// the kernel is queued, so the host's clock measures the launch: two CUDA events on ATen's
// current stream bracket the kernel too, and its time is read from them when first asked for
// (ComputePath::kernel_ms()). By then the kernel has usually finished; reading waits for it
// otherwise, never for later work. What asks: eviction's measured costs (memory.kernel_costs =
// "measured"), host swap's copy-or-recompute choice, and the step capture that the planner's
// profile and static plans read. The memory manager's recompute_ms and the memory timeline
// take the host time, which on a GPU is the launch (docs/status.md).

#include <ATen/ATen.h>

#include <chrono>
#include <memory>

namespace ht {

// A kernel's time on a device, read once its end has passed.
class DeviceKernelTime {
 public:
  virtual ~DeviceKernelTime() = default;
  virtual void record_start() = 0;  // on ATen's current stream; again for a rerun
  virtual void record_end() = 0;
  virtual double ms() = 0;  // waits for the end event
};

// CUDA events, or null where the build's libtorch has no CUDA (runtime/no_cuda_kernel_timer.cpp).
std::shared_ptr<DeviceKernelTime> make_cuda_kernel_time();

class KernelTimer {
 public:
  // CUDA events for kernels on a CUDA device when `device_events` (and the build has CUDA);
  // the host clock alone otherwise. Two events a kernel cost a few microseconds of launches.
  KernelTimer(const at::Device& device, bool device_events = true);
  void start();  // again before a rerun after making room: the rerun is timed alone
  void stop();
  double host_ms() const;
  // The events, for ComputePath::kernel_ms() to read later; null on the CPU.
  const std::shared_ptr<DeviceKernelTime>& device_time() const { return device_; }

 private:
  std::chrono::steady_clock::time_point start_, stop_;
  std::shared_ptr<DeviceKernelTime> device_;
};

}  // namespace ht

#include "runtime/kernel_timer.h"

namespace ht {

KernelTimer::KernelTimer(const at::Device& device, bool device_events) {
  if (device_events && device.is_cuda()) device_ = make_cuda_kernel_time();
}

void KernelTimer::start() {
  start_ = std::chrono::steady_clock::now();
  if (device_) device_->record_start();
}

void KernelTimer::stop() {
  if (device_) device_->record_end();
  stop_ = std::chrono::steady_clock::now();
}

double KernelTimer::host_ms() const { return std::chrono::duration<double, std::milli>(stop_ - start_).count(); }

}  // namespace ht

// Kernel times (runtime/kernel_timer.h): the host's clock on the CPU; on a GPU, CUDA events read
// when first asked for (tests/alloc/test_cuda_memory.cpp times real kernels there).
#include "runtime/kernel_timer.h"
#include "runtime/tensor_info.h"

#include <gtest/gtest.h>

namespace ht {
namespace {

TEST(KernelTimer, OnTheCpuTheHostClockAlone) {
  KernelTimer timer(at::Device(at::kCPU));
  timer.start();
  at::Tensor a = at::randn({64, 64});
  at::Tensor b = at::mm(a, a);
  timer.stop();
  EXPECT_EQ(timer.device_time(), nullptr);
  EXPECT_GE(timer.host_ms(), 0.0);
}

// Stands in for a kernel's CUDA events: counts how often they are read.
class FakeDeviceTime : public DeviceKernelTime {
 public:
  explicit FakeDeviceTime(double ms) : ms_(ms) {}
  void record_start() override {}
  void record_end() override {}
  double ms() override { return ++reads, ms_; }
  int reads = 0;

 private:
  double ms_;
};

TEST(KernelTimer, APathReadsItsDeviceTimeOnceWhenFirstAsked) {
  ComputePath path(nullptr, {});
  path.compute_ms = 0.01;  // the launch, as the host saw it
  auto events = std::make_shared<FakeDeviceTime>(2.5);
  path.pending_ms = events;
  EXPECT_EQ(events->reads, 0);  // nothing waits for the kernel until someone asks
  EXPECT_EQ(path.kernel_ms(), 2.5);
  EXPECT_EQ(path.kernel_ms(), 2.5);
  EXPECT_EQ(events->reads, 1);
  EXPECT_EQ(path.pending_ms, nullptr);
}

}  // namespace
}  // namespace ht

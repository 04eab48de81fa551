// Kernel times (runtime/kernel_timer.h): the host's clock on the CPU; on a GPU, CUDA events read
// when first asked for (tests/alloc/test_cuda_memory.cpp times real kernels there).
#include "runtime/kernel_timer.h"
#include "runtime/op_time_log.h"
#include "runtime/tensor_info.h"
#include "tests/support/op_check.h"

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

TEST(OpTimeLog, TheInterpreterLogsEveryKernelByOpAndPass) {
  // metrics.time_by_op's source: each forward and each backward kernel, keyed by op and pass.
  Interpreter interp;
  OpTimeLog log;
  interp.set_op_time_log(&log);
  at::Tensor w = at::randn({8, 8}).requires_grad_(true);
  Tensor h = interp.input(at::randn({4, 8}));
  for (int i = 0; i < 2; ++i) h = relu(linear(h, interp.param(w)));
  Tensor loss = sum(h);
  h.reset();
  EXPECT_EQ(log.pending(), 5u) << "two linear, two relu, one sum";
  interp.backward(loss);
  EXPECT_EQ(log.pending(), 10u) << "and as many backward kernels";
  const std::map<std::string, double> ms = log.take_ms();
  std::vector<std::string> keys;
  for (const auto& [op, t] : ms) {
    keys.push_back(op);
    EXPECT_GE(t, 0.0) << op;
  }
  EXPECT_EQ(keys, (std::vector<std::string>{"linear", "linear backward", "relu", "relu backward", "sum",
                                             "sum backward"}));
  EXPECT_EQ(log.pending(), 0u);
  EXPECT_TRUE(log.take_ms().empty()) << "taken once";
  interp.set_op_time_log(nullptr);
  Tensor y = relu(interp.input(at::randn({2})));
  EXPECT_EQ(log.pending(), 0u) << "no log, nothing logged";
}

TEST(OpTimeLog, KeysNameThePass) {
  EXPECT_EQ(op_time_key("gelu", OpTimeLog::Pass::kForward), "gelu");
  EXPECT_EQ(op_time_key("gelu", OpTimeLog::Pass::kRecompute), "gelu recomputed");
  EXPECT_EQ(op_time_key("gelu", OpTimeLog::Pass::kBackward), "gelu backward");
}

}  // namespace
}  // namespace ht

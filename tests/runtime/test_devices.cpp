// Says, in the test report, whether the CUDA half of the op and model checks ran.
#include "tests/support/op_check.h"

namespace ht::test {
namespace {

TEST(Devices, CudaChecksRunWhereAGpuIs) {
  if (!at::hasCUDA()) {
    GTEST_SKIP() << "no CUDA device (or a CPU-only libtorch): op and model checks ran on the CPU only";
  }
  EXPECT_EQ(test_devices().size(), 2u);
  Interpreter interp;
  at::Tensor w = at::randn({4, 4}, at::TensorOptions().device(at::kCUDA)).requires_grad_(true);
  Tensor y = relu(linear(interp.input(at::randn({2, 4}, w.options().requires_grad(false))), interp.param(w)));
  interp.backward(sum(y));
  EXPECT_TRUE(w.grad().is_cuda());
}

}  // namespace
}  // namespace ht::test

// The per-op time model (planner/op_time.h): its curves interpolate in log(size), and a kernel
// priced at the H200's rates takes the time the H200 was measured to take for it.

#include "planner/op_time.h"

#include <gtest/gtest.h>

namespace ht {
namespace {

DeviceKind h200() {
  DeviceKind k;
  k.kind = "h200";
  k.bf16_tflops = k.fp16_tflops = 989;
  k.fp32_tflops = 67;
  k.memory_gbps = 4800;
  return k;
}

TEST(OpTime, EfficiencyIsPiecewiseLinearInLogSizeAndFlatBeyondTheMeasured) {
  const std::vector<EfficiencyPoint> curve{{1e6, 0.1}, {1e8, 0.5}, {1e10, 0.7}};
  EXPECT_DOUBLE_EQ(efficiency(curve, 1e6), 0.1);
  EXPECT_NEAR(efficiency(curve, 1e7), 0.3, 1e-12) << "half-way in log size";
  EXPECT_NEAR(efficiency(curve, 1e9), 0.6, 1e-12);
  EXPECT_DOUBLE_EQ(efficiency(curve, 1e3), 0.1) << "below the smallest measured: its fraction";
  EXPECT_DOUBLE_EQ(efficiency(curve, 1e14), 0.7) << "beyond the largest: not assumed faster";
  EXPECT_DOUBLE_EQ(efficiency({}, 5), 1.0);
}

// The calibration's own points come back: Llama 3 8B's 8192 x 4096 x 4096 bf16 product took
// 0.452 ms and its 8192 x 14336 x 4096 one 1.366 ms; a 537 MB copy 0.134 ms.
TEST(OpTime, AKernelAtTheH200sRatesTakesWhatTheH200Took) {
  const DeviceRates rates = device_rates(h200());
  TraceKernel k;
  k.type = KernelType::kBf16;
  k.flops = 2.0 * 8192 * 4096 * 4096;
  k.bytes = 2.0 * (8192 * 4096 + 4096 * 4096 + 8192 * 4096);
  EXPECT_NEAR(kernel_ms(k, rates), 0.452, 0.452 * 0.01);
  k.flops = 2.0 * 8192 * 14336 * 4096;
  EXPECT_NEAR(kernel_ms(k, rates), 1.366, 1.366 * 0.01);
  k.type = KernelType::kFloat;  // the same product in fp32, no TF32: 50.9 TFLOP/s measured
  EXPECT_NEAR(kernel_ms(k, rates), k.flops / 50.9e9, k.flops / 50.9e9 * 0.02);
  TraceKernel copy;
  copy.bytes = 536870912;
  EXPECT_NEAR(kernel_ms(copy, rates), 0.134, 0.134 * 0.01) << "memory-bound: bytes at the memory curve";
  TraceKernel view;
  EXPECT_EQ(kernel_ms(view, rates), 0) << "a view moves nothing";
  TraceKernel tiny;
  tiny.bytes = 64;
  EXPECT_EQ(kernel_ms(tiny, rates), rates.kernel_floor_ms);
}

// The optimizer's time is its bytes at the memory curve: AdamW with clipping over 8B fp32
// parameters in 291 tensors moves (92 + 4 + 12) bytes each, 0.86 TB, in 9 kernels a tensor of
// 330 MB each on average: 81% of 4.8 TB/s, 0.22 s.
TEST(OpTime, TheOptimizerStepIsItsBytesAtTheMemoryCurve) {
  const DeviceRates rates = device_rates(h200());
  const double adamw = optimizer_step_ms(8'000'000'000, 291, true, true, rates);
  const double bytes = 108.0 * 8e9;
  EXPECT_NEAR(adamw, bytes / (4.8e9 * efficiency(rates.memory, bytes / 9 / 291)), 1e-6);
  EXPECT_NEAR(adamw, 222.6, 0.5);
  EXPECT_NEAR(optimizer_step_ms(8'000'000'000, 291, false, false, rates) / adamw, 48.0 / 108.0, 0.01);
  EXPECT_EQ(optimizer_step_ms(0, 0, true, true, rates), 0);
}

}  // namespace
}  // namespace ht

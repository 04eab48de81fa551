// A GPU the device catalog lacks, measured at start (launcher/planning/device_measure.h): the
// same products and copy run on this CPU at small sizes.
#include "launcher/planning/device_catalog.h"
#include "launcher/planning/device_measure.h"
#include "planner/op_time.h"

#include <gtest/gtest.h>

namespace ht::test {
namespace {

// The peaks taken back through the efficiency curves price the measured kernels at the times
// measured: the model agrees with the measurement where it was made (an identity of the
// arithmetic, whatever this machine's speed), and the kind joins this process's catalog.
TEST(DeviceMeasure, TheMeasuredPeaksPriceTheMeasuredKernelsAtTheirMeasuredTimes) {
  MeasureSizes sizes;
  sizes.matmul_n = 160;
  sizes.copy_bytes = int64_t{16} << 20;
  sizes.reps = 2;
  const int64_t memory = int64_t{24} * 1000 * 1000 * 1000;
  const MeasuredKind m = measure_device_kind(at::Device(at::kCPU), "Some Workstation Card (24GB)", memory, sizes, false);
  EXPECT_EQ(m.kind.kind, "measured-some-workstation-card-24gb");
  EXPECT_EQ(m.kind.memory_bytes, memory);
  EXPECT_GT(m.kind.fp32_tflops, 0);
  EXPECT_GT(m.kind.bf16_tflops, 0);
  EXPECT_GT(m.kind.fp16_tflops, 0);  // measured, or another dtype's rate with a note
  EXPECT_GT(m.kind.memory_gbps, 0);
  EXPECT_NE(m.kind.source.find("measured at start"), std::string::npos);
  ASSERT_GE(m.points.size(), 3u);  // fp32 and bf16 products at least, and the copy
  const DeviceRates rates = device_rates(m.kind);
  for (const MeasuredPoint& p : m.points) {
    TraceKernel k;
    k.flops = p.flops;
    k.bytes = p.bytes;
    k.type = p.type;
    EXPECT_NEAR(kernel_ms(k, rates), std::max(p.ms, rates.kernel_floor_ms), 1e-9 * p.ms) << p.what;
  }
  add_measured_kind(m.kind);
  EXPECT_EQ(catalog_kind(m.kind.kind, "", "the test").name, "Some Workstation Card (24GB)");
}

}  // namespace
}  // namespace ht::test

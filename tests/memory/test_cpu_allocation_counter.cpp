#include "memory/cpu_allocation_counter.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

namespace ht {
namespace {

TEST(CpuAllocationCounter, CountsAllocationsAndFreesAndPeaks) {
  CpuAllocationCounter& counter = CpuAllocationCounter::install();
  EXPECT_EQ(&counter, &CpuAllocationCounter::install());
  const int64_t base = counter.current_bytes();
  counter.reset_peak();
  {
    at::Tensor a = at::empty({1000}, at::kFloat);
    EXPECT_EQ(counter.current_bytes() - base, 4000);
    at::Tensor b = at::relu(a);  // an ATen kernel's output is counted too
    EXPECT_EQ(counter.current_bytes() - base, 8000);
  }
  EXPECT_EQ(counter.current_bytes(), base);
  EXPECT_EQ(counter.peak_bytes() - base, 8000);
  // oneDNN allocates through raw_allocate(), which needs context == data and a raw deleter.
  void* raw = c10::GetCPUAllocator()->raw_allocate(100);
  EXPECT_EQ(counter.current_bytes() - base, 100);
  c10::GetCPUAllocator()->raw_deallocate(raw);
  EXPECT_EQ(counter.current_bytes(), base);
  counter.reset_peak();
  EXPECT_EQ(counter.peak_bytes(), base);
}

}  // namespace
}  // namespace ht

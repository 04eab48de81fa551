#pragma once
// Counts the bytes ATen allocates on the CPU, whoever asks (our interpreter or libtorch's
// autograd), so that both sides of a comparison are measured by one ruler (BENCHMARKING.md).
// ATen's CPU allocator is a process-wide singleton; this is the one place that wraps it.
// Allocations that bypass it (oneDNN scratch space, the BLAS library's own buffers) are not seen.

#include <cstdint>

namespace ht {

class CpuAllocationCounter {
 public:
  // Installs the counting allocator on first use; later calls return the same counter.
  static CpuAllocationCounter& install();

  int64_t current_bytes() const;
  int64_t peak_bytes() const;
  // Starts a new peak measurement from the current level.
  void reset_peak();

 private:
  CpuAllocationCounter() = default;
};

}  // namespace ht

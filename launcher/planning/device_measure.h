#pragma once
// A GPU the device catalog does not describe (a workstation's card: the mission's single-GPU
// fallback) is measured at start rather than refused (issue 67): a square matrix product in each
// dtype and a large copy, each timed (CUDA events on a GPU, the host clock on a CPU; the fastest
// of a few runs after one warm-up) and turned into the kind's peaks through the efficiency curves
// the per-op model prices with (planner/op_time.h): a peak is the measured rate over the curve's
// fraction at the measured size, so the model prices the measured kernels at their measured times
// and every other size by the curves' shape, which was measured on an H200 (a card of another
// generation may bend differently). About a second on a GPU, behind a progress line. Not
// measured: the links between such cards, priced at PCIe 4.0 x16's 25 GB/s each way, and the
// network, at 100 Gb/s (the kind's `source` says so).

#include "planner/device.h"
#include "planner/step_trace.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ht {

struct MeasureSizes {
  int64_t matmul_n = 4096;                 // the square product's side: 137 GFLOP
  int64_t copy_bytes = int64_t{256} << 20;  // the copy's source
  int reps = 5;
};

// One timed kernel: its work as the per-op model reads it (TraceKernel's flops or bytes) and the
// fastest time measured.
struct MeasuredPoint {
  std::string what;  // "bf16 product 4096^3", "copy of 256 MiB"
  KernelType type = KernelType::kFloat;
  double flops = 0, bytes = 0, ms = 0;
};

struct MeasuredKind {
  DeviceKind kind;
  std::vector<MeasuredPoint> points;
  std::vector<std::string> notes;  // a dtype the device could not multiply in, priced at another's rate
};

// The catalog key of a measured card: "measured-" and its name in lower case, words joined by '-'.
std::string measured_kind_key(const std::string& gpu_name);

// Measures `device` as above; `name` and `memory_bytes` as the driver gives them.
MeasuredKind measure_device_kind(const at::Device& device, const std::string& name, int64_t memory_bytes,
                                 const MeasureSizes& sizes = {}, bool progress = true);

}  // namespace ht

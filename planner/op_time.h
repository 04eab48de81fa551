#pragma once
// The per-op time model: each traced kernel's work (planner/step_trace.h: flops, bytes, element
// type) priced on a device as a roofline whose two roofs are the device's published peaks
// (planner/device.h) scaled by the efficiency a device of its class was measured to achieve at
// that size: a contraction's fraction of the dense peak by its flops, a memory-bound kernel's
// fraction of the memory bandwidth by the bytes it moves. Not one speed factor: a 9.7 GFLOP
// GEMM reaches 22% of an H200's bf16 peak, a 1.1 TFLOP one 75%.
//
// The curves are measured, not assumed: the GPU ones on the H200 lent on 2026-11-26
// (docs/measurements/h200-2026-11-26-calibration.json, printed as C++ by
// scripts/calibration_curves.py) and applied, as fractions of each kind's own peaks, to every GPU
// kind of the catalog. A kind measured on a lent device of its own gets its own curves the same way.

#include "planner/device.h"
#include "planner/step_trace.h"

#include <cstdint>
#include <string>
#include <vector>

namespace ht {

// A measured size (flops, or bytes moved) and the fraction of the peak achieved there.
struct EfficiencyPoint {
  double size = 0;
  double fraction = 0;
};

struct DeviceRates {
  std::string calibration;    // where the curves come from, for the report
  double flops_per_ms[3] = {0, 0, 0};  // dense peaks by KernelType: fp32, bf16, fp16
  double bytes_per_ms = 0;    // memory bandwidth
  std::vector<EfficiencyPoint> contraction[3];  // by KernelType
  std::vector<EfficiencyPoint> memory;
  // Beside the curves, measured on the same device (scripts/device-kernels.py): 16-bit
  // attention's fused kernel by its query length (forward, backward; none: the contraction
  // curve), a misaligned 16-bit contraction at a share of the aligned one's rate (forward,
  // backward), a type-converting memory-bound loop at a share of the memory curve.
  std::vector<EfficiencyPoint> attention[2];
  double misaligned_share[2] = {1, 1};
  double converting_share = 1;
  // The least a kernel costs in a stream of them (launch and the interpreter's bookkeeping
  // overlap the previous kernel): a floor, not an addition.
  double kernel_floor_ms = 0.005;
};

// The fraction at `size` on `curve`: piecewise linear in log(size) between measured points, the
// end points' fractions beyond them (a larger kernel is not assumed faster than the largest measured).
double efficiency(const std::vector<EfficiencyPoint>& curve, double size);
// A catalog kind's rates: its peaks with the GPU curves (above).
DeviceRates device_rates(const DeviceKind& kind);
// One kernel's time: the slower of its compute at the contraction curve (attention's own
// fraction; the misaligned share) and its bytes at the memory curve (the converting share), at
// least the floor. Views (no work) cost nothing.
double kernel_ms(const TraceKernel& kernel, const DeviceRates& rates);
// The optimizer step and the gradients' zeroing and clipping for `elements` fp32 parameters,
// memory-bound: the bytes libtorch's kernels move per element (AdamW: 92, SGD with momentum and
// weight decay: 44; zeroing 4; clipping's norm and scale 12) at the memory curve of one
// parameter's size, a kernel per step of the rule on each of `tensors` tensors. `fused`: ATen's
// multi-tensor AdamW on CUDA (training/fused_optimizer.h), reading and writing each element's
// weight and moments once and its gradient once (28 bytes; SGD's momentum form 20), 36 tensors a
// launch, at the share of the memory curve the H200 measured; the clipping coefficient applied
// inside it and the scaled gradient written back (4), and clipping's norms reading the gradients
// once more (4, a kernel a tensor).
double optimizer_step_ms(int64_t elements, int64_t tensors, bool adamw, bool clipping, const DeviceRates& rates,
                         bool fused = false);

}  // namespace ht

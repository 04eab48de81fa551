#pragma once
// The modelled cost of a kernel: what eviction weighs, under memory.kernel_costs = "modeled",
// when it asks how dear a tensor is to recompute. A model of the kernel's work (bytes moved, or
// multiply-adds; the op declares which, OpTraits::work), not a timing: the same op on the same
// shapes costs the same on a loaded machine as on an idle one, so DTR chooses the same victims
// from run to run, blocks land where they landed before, and a budget that trained once trains
// every time. A measured time (memory.kernel_costs = "measured") follows the machine's noise.
//
// The rates are one core of the 2-core CI machine's, fitted to a ResNet-18 and a GPT step: its
// GEMMs and convolutions run at about 100 GFLOP/s, its elementwise kernels move about 3 GB/s,
// and an op that draws random numbers (dropout) takes about four times its bytes' time. Only their
// ratios change a policy's choice, since every candidate's cost is scaled alike.

#include "runtime/op.h"

#include <vector>

namespace ht {

inline constexpr double kModeledFlopsPerMs = 1e8;
inline constexpr double kModeledBytesPerMs = 3e6;
inline constexpr double kModeledRandomFactor = 4;

// What one kernel does, from its inputs and outputs as it read and wrote them: floating-point
// operations (2 a multiply-add; contractions, convolutions and attention only), bytes read and
// written (an output that views an input moves nothing), and the element type of its first
// input (what a contraction's rate depends on). The planner prices it on a device
// (planner/op_time.h); modeled_kernel_ms prices it on this CPU.
struct KernelWork {
  double flops = 0;
  double bytes = 0;
  at::ScalarType dtype = at::kFloat;
  bool views_only = false;  // every output views an input
  double input_bytes = 0;   // what the inputs hold (a view op's backward may write as much)
  // A 16-bit contraction with a dimension that is not a multiple of 8 (GPT-2's 50,257-word
  // output layer): cuBLAS leaves the tensor cores' fast paths (planner/op_time.cpp).
  bool misaligned = false;
  // A memory-bound kernel whose output's element type is not its input's (a cast): ATen's
  // type-converting loops run unvectorized, at a third of a copy's bandwidth on an H200.
  bool converts = false;
  // An input has fewer elements than the first output (broadcast along some dimension).
  bool broadcasts = false;
  // Attention: its query length (q's T), which sets a fused kernel's rate (planner/op_time.cpp).
  int64_t attention_length = 0;
};
KernelWork kernel_work(const OpTraits& traits, const std::vector<at::Tensor>& inputs,
                       const std::vector<at::Tensor>& outputs);
double modeled_kernel_ms(const OpTraits& traits, const KernelWork& work);

// `inputs` and `outputs` as the kernel read and wrote them. An op whose every output is a view of
// an input moves nothing: it costs nothing (eviction gives such tensors a floor of its own).
double modeled_kernel_ms(const OpTraits& traits, const std::vector<at::Tensor>& inputs,
                         const std::vector<at::Tensor>& outputs);

}  // namespace ht

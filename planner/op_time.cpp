#include "planner/op_time.h"

#include <algorithm>
#include <cmath>

namespace ht {
namespace {

// Measured on an NVIDIA H200 (PyTorch 2.11, CUDA 13.0), 2026-11-26: torch.matmul of (m, k) x
// (k, n) at m, n, k from 256 to 16384 and the shapes of GPT-2 and Llama 3 8B/70B layers (cuBLAS, the
// kernels libtorch runs for our linear layers), CUDA-event medians of 10 after 3 warm-ups; fractions of the catalog's h200 peaks (bf16 and fp16
// 989 TFLOP/s, fp32 67 TFLOP/s: PyTorch's default fp32 matmul does not use TF32). Printed by
// scripts/calibration_curves.py from docs/measurements/h200-2026-11-26-calibration.json.
const std::vector<EfficiencyPoint> kHopperFloat{
    {3.36e+07, 0.018}, {2.68e+08, 0.145}, {2.15e+09, 0.448}, {9.66e+09, 0.622}, {1.72e+10, 0.675}, {3.44e+10, 0.747},
    {3.87e+10, 0.665}, {6.87e+10, 0.753}, {1.37e+11, 0.739}, {2.75e+11, 0.754}, {6.33e+11, 0.725}, {9.62e+11, 0.750},
    {1.1e+12, 0.758},  {3.85e+12, 0.766}, {8.61e+12, 0.785}, {8.8e+12, 0.788}};
const std::vector<EfficiencyPoint> kHopperBf16{
    {3.36e+07, 0.002}, {2.68e+08, 0.013}, {2.15e+09, 0.097}, {9.66e+09, 0.218}, {1.72e+10, 0.423}, {3.44e+10, 0.487},
    {3.87e+10, 0.440}, {6.87e+10, 0.577}, {1.37e+11, 0.741}, {2.75e+11, 0.615}, {6.33e+11, 0.554}, {9.62e+11, 0.719},
    {1.1e+12, 0.747},  {3.85e+12, 0.702}, {8.61e+12, 0.682}, {8.8e+12, 0.706}};
const std::vector<EfficiencyPoint> kHopperFp16{
    {3.36e+07, 0.002}, {2.68e+08, 0.013}, {2.15e+09, 0.097}, {9.66e+09, 0.257}, {1.72e+10, 0.368}, {3.44e+10, 0.407},
    {3.87e+10, 0.463}, {6.87e+10, 0.519}, {1.37e+11, 0.712}, {2.75e+11, 0.617}, {6.33e+11, 0.543}, {9.62e+11, 0.689},
    {1.1e+12, 0.712},  {3.85e+12, 0.670}, {8.61e+12, 0.657}, {8.8e+12, 0.666}};
// The same day: copies and adds of 2 MB to 13 GB moved; fractions of the h200's 4,800 GB/s.
const std::vector<EfficiencyPoint> kHopperMemory{
    {2.1e+06, 0.033}, {3.15e+06, 0.045}, {8.39e+06, 0.129}, {1.26e+07, 0.206}, {3.36e+07, 0.515},
    {5.03e+07, 0.574}, {1.34e+08, 0.704}, {2.01e+08, 0.782}, {5.37e+08, 0.835}, {8.05e+08, 0.877},
    {2.15e+09, 0.877}, {3.22e+09, 0.902}, {8.59e+09, 0.895}, {1.29e+10, 0.910}};

}  // namespace

double efficiency(const std::vector<EfficiencyPoint>& curve, double size) {
  if (curve.empty()) return 1.0;
  if (size <= curve.front().size) return curve.front().fraction;
  if (size >= curve.back().size) return curve.back().fraction;
  size_t hi = 1;
  while (curve[hi].size < size) ++hi;
  const EfficiencyPoint& a = curve[hi - 1];
  const EfficiencyPoint& b = curve[hi];
  const double t = (std::log(size) - std::log(a.size)) / (std::log(b.size) - std::log(a.size));
  return a.fraction + t * (b.fraction - a.fraction);
}

DeviceRates device_rates(const DeviceKind& kind) {
  DeviceRates r;
  r.calibration = "peaks of " + kind.kind + " (configs/devices.toml) at the efficiency curves measured on an "
                  "H200 on 2026-11-26 (docs/measurements/h200-2026-11-26-calibration.json)";
  r.flops_per_ms[static_cast<int>(KernelType::kFloat)] = kind.fp32_tflops * 1e9;
  r.flops_per_ms[static_cast<int>(KernelType::kBf16)] = kind.bf16_tflops * 1e9;
  r.flops_per_ms[static_cast<int>(KernelType::kFp16)] = kind.fp16_tflops * 1e9;
  r.bytes_per_ms = kind.memory_gbps * 1e6;
  r.contraction[static_cast<int>(KernelType::kFloat)] = kHopperFloat;
  r.contraction[static_cast<int>(KernelType::kBf16)] = kHopperBf16;
  r.contraction[static_cast<int>(KernelType::kFp16)] = kHopperFp16;
  r.memory = kHopperMemory;
  // Measured on the H200 on 2026-11-29 (scripts/device-kernels.py, PyTorch 2.11, under
  // hybrid_train's determinism; docs/measurements/h200-2026-11-29-kernels.json). ATen's flash
  // attention, causal, bf16, 16,384 tokens of 2,048 features a call, head sizes 64 and 128
  // averaged (they differ by 2-9%): its rate by query length, as fractions of the 989 TFLOP/s.
  // FlashAttention-2's Hopper fractions, for Hopper kinds only: on an A100 it reaches about
  // twice the fraction (its paper), not measured here, so other kinds keep the contraction curve.
  if (kind.kind.rfind("h100", 0) == 0 || kind.kind.rfind("h200", 0) == 0) {
    r.attention[0] = {{1024, 0.193}, {2048, 0.242}, {4096, 0.281}, {8192, 0.301}};
    r.attention[1] = {{1024, 0.140}, {2048, 0.183}, {4096, 0.194}, {8192, 0.177}};
  }
  // GPT-2's output layer at its 50,257 words against 50,304 (32,768 tokens, bf16): forward 93.8
  // against 697.1 TFLOP/s; backward's two products 18.4 and 17.1 ms against 3.2 and 3.4. A
  // bf16-to-fp32 cast of its logits moved 1,608 GB/s, where copies of that size moved 4,300.
  r.misaligned_share[0] = 93.8 / 697.1;                         // rates: misaligned over aligned
  r.misaligned_share[1] = (3.223 + 3.413) / (18.396 + 17.132);  // times: aligned over misaligned
  r.converting_share = 1608.0 / 4300;
  return r;
}

double kernel_ms(const TraceKernel& kernel, const DeviceRates& rates) {
  if (kernel.flops <= 0 && kernel.bytes <= 0) return 0;
  const int type = static_cast<int>(kernel.type);
  double ms = 0;
  const int pass = kernel.backward ? 1 : 0;
  if (kernel.flops > 0 && rates.flops_per_ms[type] > 0) {
    double fraction = efficiency(rates.contraction[type], kernel.flops);
    if (kernel.attention_length > 0 && kernel.type != KernelType::kFloat && !rates.attention[pass].empty()) {
      fraction = efficiency(rates.attention[pass], static_cast<double>(kernel.attention_length));
    }
    if (kernel.misaligned) fraction *= rates.misaligned_share[pass];
    ms = kernel.flops / (rates.flops_per_ms[type] * fraction);
  }
  if (kernel.bytes > 0 && rates.bytes_per_ms > 0) {
    const double share = kernel.converts ? rates.converting_share : 1.0;
    ms = std::max(ms, kernel.bytes / (rates.bytes_per_ms * efficiency(rates.memory, kernel.bytes) * share));
  }
  return std::max(ms, rates.kernel_floor_ms);
}

// ATen's multi-tensor AdamW on CUDA (the fused path on a catalog device): up to 36 tensors a launch
// (multi_tensor_apply's limit at four lists), at 0.78 of the memory curve's rate: on the H200 it
// moved GPT-2 124M's 3.46 GB in 1.03 ms (3.36 TB/s) where a copy of that size runs at 4.3
// (`bench_fused_optimizer --device cuda`, 2026-12-04: its arithmetic is not a copy's).
constexpr double kFusedTensorsPerLaunch = 36, kFusedAdamWShare = 0.78;

double optimizer_step_ms(int64_t elements, int64_t tensors, bool adamw, bool clipping, const DeviceRates& rates,
                         bool fused) {
  if (elements <= 0 || rates.bytes_per_ms <= 0) return 0;
  // libtorch's AdamW, per element in fp32: the decay p.mul_ (8 bytes), m.mul_ and m.add_(g) (8 + 12),
  // v.mul_ and v.addcmul_(g, g) (8 + 16), denominator v.sqrt(), /, add_ (8 + 8 + 8), p.addcdiv_ (16);
  // SGD: g.add(p) for the decay (12), buf.mul_ and add_ (8 + 12), p.add_ (12). Fused: p, m, v read
  // and written, g read (28); p and the momentum buffer read and written, g read (20).
  const double n = static_cast<double>(std::max<int64_t>(1, tensors));
  if (fused) {
    // The update in multi-tensor launches (with clipping it writes the scaled gradient back: 4 more
    // bytes); the zeroing (4 bytes) and clipping's norms (4) beside it.
    const double update = ((adamw ? 28.0 : 20.0) + (clipping ? 4.0 : 0.0)) * static_cast<double>(elements);
    const double launches = std::ceil(n / kFusedTensorsPerLaunch);
    const double share = adamw ? kFusedAdamWShare : 1.0;
    const double update_ms = update / (rates.bytes_per_ms * efficiency(rates.memory, update / launches) * share);
    const double rest = (4.0 + (clipping ? 4.0 : 0.0)) * static_cast<double>(elements);
    const double rest_ms = rest / (rates.bytes_per_ms * efficiency(rates.memory, rest / n));
    return std::max(update_ms + rest_ms, (launches + (clipping ? n : 0.0)) * rates.kernel_floor_ms);
  }
  const double kernels = adamw ? 9 : 4;
  const double per_element = (adamw ? 92.0 : 44.0) + 4.0 + (clipping ? 12.0 : 0.0);
  const double bytes = per_element * static_cast<double>(elements);
  const double mean_tensor = bytes / kernels / n;
  const double ms = bytes / (rates.bytes_per_ms * efficiency(rates.memory, mean_tensor));
  return std::max(ms, kernels * n * rates.kernel_floor_ms);
}

}  // namespace ht

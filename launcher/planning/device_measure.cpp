#include "launcher/planning/device_measure.h"

#include "planner/op_time.h"
#include "runtime/kernel_timer.h"
#include "training/run_output.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <functional>
#include <limits>
#include <stdexcept>
#include <unistd.h>

namespace ht {
namespace {

// The fastest of `reps` runs of `kernel` after one warm-up, in ms.
double fastest_kernel_ms(const at::Device& device, int reps, const std::function<void()>& kernel) {
  kernel();
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < std::max(1, reps); ++i) {
    KernelTimer timer(device);
    timer.start();
    kernel();
    timer.stop();
    best = std::min(best, timer.device_time() ? timer.device_time()->ms() : timer.host_ms());
  }
  return best;
}

const char* measured_type_name(KernelType t) {
  return t == KernelType::kFloat ? "fp32" : t == KernelType::kBf16 ? "bf16" : "fp16";
}

at::ScalarType measured_dtype(KernelType t) {
  return t == KernelType::kFloat ? at::kFloat : t == KernelType::kBf16 ? at::kBFloat16 : at::kHalf;
}

}  // namespace

std::string measured_kind_key(const std::string& gpu_name) {
  std::string key = "measured";
  bool gap = true;
  for (char c : gpu_name) {
    if (std::isalnum(static_cast<unsigned char>(c))) {
      if (gap) key += '-';
      key += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      gap = false;
    } else {
      gap = true;
    }
  }
  return key;
}

MeasuredKind measure_device_kind(const at::Device& device, const std::string& name, int64_t memory_bytes,
                                 const MeasureSizes& sizes, bool progress) {
  MeasuredKind out;
  DeviceKind& k = out.kind;
  k.kind = measured_kind_key(name);
  k.name = name;
  k.memory_bytes = memory_bytes;
  // The links are not measured: PCIe 4.0 x16 between cards, 100 Gb/s between nodes.
  k.intra_node_gbps = 25;
  k.inter_node_gbps = 12.5;
  const DeviceRates curves = device_rates(DeviceKind{});  // the curves alone: fractions of any peak
  const bool tty = progress && ::isatty(::fileno(stdout)) != 0;
  bool line_open = false;
  const auto show = [&](const std::string& text) {
    if (progress) draw_progress_line(("measuring " + name + " for the planner: " + text).c_str(), tty, line_open);
  };
  const int64_t n = sizes.matmul_n;
  const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
  double rate[3] = {0, 0, 0};  // TFLOP/s peaks by KernelType
  std::string measured_types;
  for (KernelType t : {KernelType::kFloat, KernelType::kBf16, KernelType::kFp16}) {
    const std::string what = std::string(measured_type_name(t)) + " product " + std::to_string(n) + "^3";
    show(what);
    try {
      const at::TensorOptions options = at::TensorOptions().dtype(measured_dtype(t)).device(device);
      const at::Tensor a = at::randn({n, n}, options), b = at::randn({n, n}, options);
      at::Tensor c = at::empty({n, n}, options);
      const double ms = fastest_kernel_ms(device, sizes.reps, [&] { at::mm_out(c, a, b); });
      const double fraction = efficiency(curves.contraction[static_cast<int>(t)], flops);
      rate[static_cast<int>(t)] = flops / (ms * fraction) / 1e9;
      out.points.push_back({what, t, flops, 0, ms});
      measured_types += (measured_types.empty() ? "" : ", ") + std::string(measured_type_name(t));
    } catch (const c10::Error& e) {
      const std::string why = e.what_without_backtrace();
      out.notes.push_back(what + " did not run on " + device.str() + " (" + why.substr(0, why.find('\n')) +
                          "): priced at another dtype's rate");
    }
  }
  if (rate[0] <= 0 && rate[1] <= 0) {
    throw std::runtime_error("measuring " + name + ": neither an fp32 nor a bf16 product ran on " + device.str());
  }
  k.fp32_tflops = rate[0] > 0 ? rate[0] : rate[1];
  k.bf16_tflops = rate[1] > 0 ? rate[1] : rate[0];
  k.fp16_tflops = rate[2] > 0 ? rate[2] : k.bf16_tflops;
  const std::string copy = "copy of " + std::to_string(sizes.copy_bytes >> 20) + " MiB";
  show(copy);
  try {
    const at::Tensor from = at::empty({sizes.copy_bytes}, at::TensorOptions().dtype(at::kByte).device(device)).fill_(1);
    at::Tensor to = at::empty_like(from);
    const double ms = fastest_kernel_ms(device, sizes.reps, [&] { to.copy_(from); });
    const double moved = 2.0 * static_cast<double>(sizes.copy_bytes);  // read and written
    k.memory_gbps = moved / (ms * efficiency(curves.memory, moved)) / 1e6;
    out.points.push_back({copy, KernelType::kFloat, 0, moved, ms});
  } catch (const c10::Error& e) {
    const std::string why = e.what_without_backtrace();
    throw std::runtime_error("measuring " + name + ": the " + copy + " did not run on " + device.str() + " (" +
                             why.substr(0, why.find('\n')) + ")");
  }
  if (line_open) std::printf("\n");
  char source[400];
  std::snprintf(source, sizeof source, "measured at start on %s (%s products of %lld^3, a copy of %lld MiB; the "
                "H200's efficiency curves; links assumed: PCIe 4.0 x16 between cards, 100 Gb/s between nodes)",
                device.str().c_str(), measured_types.c_str(), static_cast<long long>(n),
                static_cast<long long>(sizes.copy_bytes >> 20));
  k.source = source;
  return out;
}

}  // namespace ht

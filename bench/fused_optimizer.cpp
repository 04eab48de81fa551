// The fused optimizer step (training/fused_optimizer.h) against torch::optim's on the same
// parameters and gradients, side by side in one invocation: AdamW with weight decay and SGD with
// momentum, on a model's parameter shapes (the small Llama's 6.5M, and GPT-2 124M's), steps
// interleaved, the medians and their ratio. Both start from the same values and take the same
// gradients, so after the last step every parameter must be the same bits: exits 1 if not.
//
// --device cuda: AdamW on the GPU, where the fused step is ATen's multi-tensor kernel
// (libtorch >= 2.4; torch::optim's kernels where it has none), timed to the device's completion;
// its arithmetic has fewer roundings than torch::optim's sequence, so there every parameter must
// be within 1e-5 of it (relative) instead: exits 1 if not. SGD and bf16 moments take
// torch::optim's kernels on a GPU and are not measured there.
//
//   bench_fused_optimizer [--reps 5] [--warmup 1] [--threads 1] [--quick] [--device cpu|cuda]
#include "base/compat.h"
#include "bench/bench_main.h"
#include "bench/bench_util.h"
#include "training/fused_optimizer.h"
#include "training/optimizer.h"

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ht {
namespace {

struct Shapes {
  const char* name;
  std::vector<std::vector<int64_t>> tensors;
};

// A decoder's parameter shapes: embedding, each layer's norms and matrices, the head.
Shapes decoder_shapes(const char* name, int64_t vocab, int64_t layers, int64_t h, int64_t qkv, int64_t f, bool gated,
                      bool tied) {
  Shapes s{name, {}};
  s.tensors.push_back({vocab, h});
  for (int64_t l = 0; l < layers; ++l) {
    s.tensors.push_back({h});
    s.tensors.push_back({qkv, h});
    s.tensors.push_back({h, h});
    s.tensors.push_back({h});
    s.tensors.push_back({gated ? 2 * f : f, h});
    s.tensors.push_back({h, f});
  }
  s.tensors.push_back({h});
  if (!tied) s.tensors.push_back({vocab, h});
  return s;
}

using MakeOptimizer = std::function<std::unique_ptr<torch::optim::Optimizer>(const std::vector<at::Tensor>&)>;

struct Side {
  std::vector<at::Tensor> params;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::vector<double> ms;
};

Side make_side(const Shapes& shapes, const MakeOptimizer& make, const at::Device& device) {
  Side side;
  at::manual_seed(7);
  for (const auto& sizes : shapes.tensors) {
    at::Tensor p = at::randn(sizes).to(device).requires_grad_(true);
    p.mutable_grad() = (at::randn(sizes) * 1e-3).to(device);
    side.params.push_back(p);
  }
  side.optimizer = make(side.params);
  return side;
}

double step_ms(Side& side) {
  const bool gpu = side.params.front().is_cuda();
  if (gpu) torch::cuda::synchronize();
  const auto start = std::chrono::steady_clock::now();
  side.optimizer->step();
  if (gpu) torch::cuda::synchronize();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

struct Result {
  std::string row;
  int64_t elements = 0;
  double fused_ms = 0, reference_ms = 0;
  bool same = true;
  double largest_relative = 0;  // the largest |a - b| / max |b|, over the parameters
};

Result compare(const Shapes& shapes, const char* kind, const MakeOptimizer& fused, const MakeOptimizer& reference,
               const bench::StepOptions& o, const at::Device& device) {
  Side a = make_side(shapes, fused, device), b = make_side(shapes, reference, device);
  for (int i = 0; i < o.warmup + o.reps; ++i) {
    const bool measured = i >= o.warmup;
    // Interleaved, the order alternating: neither side always runs on a cache the other warmed.
    if (i % 2 == 0) {
      const double x = step_ms(a), y = step_ms(b);
      if (measured) a.ms.push_back(x), b.ms.push_back(y);
    } else {
      const double y = step_ms(b), x = step_ms(a);
      if (measured) a.ms.push_back(x), b.ms.push_back(y);
    }
  }
  Result r;
  r.row = std::string(shapes.name) + ", " + kind;
  for (size_t i = 0; i < a.params.size(); ++i) {
    r.elements += a.params[i].numel();
    r.same = r.same && a.params[i].equal(b.params[i]);
    const double range = b.params[i].abs().max().item<double>();
    if (range > 0) {
      r.largest_relative =
          std::max(r.largest_relative, (a.params[i] - b.params[i]).abs().max().item<double>() / range);
    }
  }
  r.fused_ms = bench::median(a.ms);
  r.reference_ms = bench::median(b.ms);
  return r;
}

}  // namespace
}  // namespace ht

int main(int argc, char** argv) {
  using namespace ht;
  CLI::App app{"The fused optimizer step against torch::optim's, side by side"};
  bench::StepOptions o;
  bool quick = false;
  std::string device_name = "cpu";
  bench::add_step_options(app, o);
  app.add_flag("--quick", quick, "the small Llama's shapes only");
  app.add_option("--device", device_name, "cpu, or cuda: AdamW on the GPU")->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (device_name == "cuda" && !torch::cuda::is_available()) {
    std::fprintf(stderr, "bench_fused_optimizer: --device cuda: no GPU is visible, or this libtorch has no CUDA\n");
    return 2;
  }
  const at::Device device(device_name);
  const bool gpu = device.is_cuda();
  const ThreadPools pools = bench::use_threads(o.threads);

  std::vector<Shapes> models{decoder_shapes("Llama small (6.5M)", 8000, 6, 256, 512, 704, true, false)};
  if (!quick) models.push_back(decoder_shapes("GPT-2 124M", 50257, 12, 768, 3 * 768, 4 * 768, false, true));
  const MakeOptimizer fused_adamw = [](const std::vector<at::Tensor>& p) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<FusedAdamW>(p, torch::optim::AdamWOptions(1e-3).betas({0.9, 0.95}).weight_decay(0.1));
  };
  const MakeOptimizer adamw = [](const std::vector<at::Tensor>& p) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(1e-3).betas({0.9, 0.95}).weight_decay(0.1));
  };
  // training.optimizer_state_dtype = "bf16": the moments widened, stepped in fp32, rounded back.
  const MakeOptimizer fused_adamw_bf16 = [](const std::vector<at::Tensor>& p) -> std::unique_ptr<torch::optim::Optimizer> {
    auto o = std::make_unique<FusedAdamW>(p, torch::optim::AdamWOptions(1e-3).betas({0.9, 0.95}).weight_decay(0.1));
    o->set_state_dtype(at::kBFloat16);
    return o;
  };
  const MakeOptimizer fused_sgd = [](const std::vector<at::Tensor>& p) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<FusedSgd>(p, torch::optim::SGDOptions(1e-2).momentum(0.9).weight_decay(1e-4));
  };
  const MakeOptimizer sgd = [](const std::vector<at::Tensor>& p) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(1e-2).momentum(0.9).weight_decay(1e-4));
  };
  if (gpu) {
    std::printf("The optimizer step on %s: fused (ATen's multi-tensor AdamW: %s) against torch::optim, %d measured "
                "steps each, interleaved, after %d, timed to the device's completion\n\n",
                torch::cuda::device_count() > 0 ? "CUDA" : "?", compat::kFusedAdamWOnCuda ? "yes" : "no, libtorch < 2.4",
                o.reps, o.warmup);
  } else {
    std::printf("The optimizer step: fused (one pass a parameter) against torch::optim, %d measured steps each, "
                "interleaved, after %d; %s; vectorized pass: %s\n\n",
                o.reps, o.warmup, pools.describe().c_str(), fused_step_is_vectorized() ? "yes" : "no (no AVX2 with FMA)");
  }
  std::printf("%-40s %12s %12s %14s %8s %s\n", "parameters, optimizer", "elements", "fused ms", "torch::optim ms", "ratio",
              gpu ? "largest relative difference" : "same bits");
  bool ok = true;
  // Within rounding on a GPU: the kernel's arithmetic is not torch::optim's sequence.
  constexpr double kGpuTolerance = 1e-5;
  for (const Shapes& m : models) {
    for (const int kind : {0, 1, 2}) {
      if (gpu && kind != 0) continue;  // not fused on a GPU
      const Result r = kind == 0   ? compare(m, "AdamW", fused_adamw, adamw, o, device)
                       : kind == 1 ? compare(m, "AdamW bf16 moments", fused_adamw_bf16, adamw, o, device)
                                   : compare(m, "SGD", fused_sgd, sgd, o, device);
      // bf16 moments round what torch::optim keeps in fp32: other bits by design (tested against
      // torch::optim with its moments rounded, tests/training/test_fused_optimizer.cpp).
      if (gpu) {
        ok &= r.largest_relative <= kGpuTolerance;
      } else if (kind != 1) {
        ok &= r.same;
      }
      char check[64];
      if (gpu) {
        std::snprintf(check, sizeof check, "%.2e%s", r.largest_relative, r.largest_relative <= kGpuTolerance ? "" : " (OVER)");
      } else {
        std::snprintf(check, sizeof check, "%s", kind == 1 ? "(rounded)" : r.same ? "yes" : "NO");
      }
      std::printf("%-40s %12lld %12.2f %14.2f %8.2f %s\n", r.row.c_str(), static_cast<long long>(r.elements), r.fused_ms,
                  r.reference_ms, r.fused_ms / r.reference_ms, check);
      std::fflush(stdout);
    }
  }
  std::printf("\n(ratio: fused / torch::optim, lower is faster; the fused pass reads and writes each fp32 parameter and "
              "its state once and reads its gradient once: 28 bytes an element for AdamW, 20 with bf16 moments, 20 for SGD with "
              "momentum)\n");
  if (!ok) {
    std::printf(gpu ? "FAILED: the fused step's parameters are not within %.0e of torch::optim's\n"
                    : "FAILED: the fused step's parameters are not torch::optim's bits\n",
                kGpuTolerance);
  }
  return ok ? 0 : 1;
}

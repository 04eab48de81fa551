// One training step (forward, loss, backward, SGD update) through our interpreter vs. the same
// forward recorded by libtorch's autograd, in one process, interleaved (A B, B A, ...) after
// warm-up. Prints the median step-time ratio with its min-max spread, and the peak bytes ATen
// allocated above the step's starting level, counted for both sides by one allocator hook.
#include "bench/bench_main.h"
#include "bench/bench_util.h"
#include "alloc/cpu_device_allocator.h"
#include "alloc/cuda_arena.h"
#include "models/decoder.h"
#include "models/mlp.h"
#include "models/resnet.h"
#include "runtime/determinism.h"
#include "runtime/thread_pools.h"

#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <torch/optim/sgd.h>

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace ht::bench {
namespace {

struct Workload {
  std::string name;
  std::function<std::shared_ptr<Model>()> make;
  at::Tensor input, target;
};

struct Side {
  std::shared_ptr<Model> model;
  std::unique_ptr<torch::optim::SGD> sgd;
  ExecutionMode mode;
  std::vector<double> ms;
  int64_t peak_bytes = 0;
  double last_loss = 0;
};

// --device: where both sides train. On a GPU both allocate from ATen's caching allocator, whose
// statistics count the bytes in tensors (the CPU's are counted by our allocator hook).
at::Device g_device(at::kCPU);

void step(Side& side, const Workload& w, uint64_t seed) {
  Interpreter interp(InterpreterOptions{side.mode, seed});
  Tensor loss = side.model->loss(side.model->forward(interp.input(w.input)), interp.input(w.target));
  interp.backward(loss);
  side.last_loss = loss.value().item<double>();
  side.sgd->step();
  for (at::Tensor& p : side.model->parameters()) p.mutable_grad() = at::Tensor();
  // On a GPU the step is over when its kernels are: reading one value waits for the stream.
  if (g_device.is_cuda()) side.model->parameters().front().view(-1).slice(0, 0, 1).item<float>();
}

int64_t allocated_now() {
  return g_device.is_cuda() ? cuda_allocated_bytes(0) : CpuAllocationCounter::install().current_bytes();
}

void measure(Side& side, const Workload& w, uint64_t seed) {
  CpuAllocationCounter& counter = CpuAllocationCounter::install();
  counter.reset_peak();
  if (g_device.is_cuda()) reset_cuda_allocated_peak(0);
  const int64_t start_bytes = allocated_now();
  const auto t0 = std::chrono::steady_clock::now();
  step(side, w, seed);
  side.ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  const int64_t peak = g_device.is_cuda() ? cuda_allocated_peak_bytes(0) : counter.peak_bytes();
  side.peak_bytes = std::max(side.peak_bytes, peak - start_bytes);
}

void run(const Workload& on_host, int warmup, int reps) {
  Workload w = on_host;
  w.input = w.input.to(g_device);
  w.target = w.target.to(g_device);
  auto make_side = [&](ExecutionMode mode) {
    Side s;
    at::manual_seed(0);
    s.model = w.make();
    if (g_device.is_cuda()) s.model->move_to(g_device, at::kFloat);
    s.model->train();
    s.sgd = std::make_unique<torch::optim::SGD>(s.model->parameters(), torch::optim::SGDOptions(1e-3));
    s.mode = mode;
    return s;
  };
  Side ours = make_side(ExecutionMode::kInterpreted);
  Side ref = make_side(ExecutionMode::kAutograd);
  uint64_t seed = 1;
  for (int i = 0; i < warmup; ++i, ++seed) {
    step(ref, w, seed);
    step(ours, w, seed);
  }
  std::vector<double> ratios;
  double max_loss_gap = 0;
  for (int i = 0; i < reps; ++i, ++seed) {
    if (i % 2 == 0) {
      measure(ref, w, seed);
      measure(ours, w, seed);
    } else {
      measure(ours, w, seed);
      measure(ref, w, seed);
    }
    ratios.push_back(ours.ms.back() / ref.ms.back());
    max_loss_gap = std::max(max_loss_gap, std::abs(ours.last_loss - ref.last_loss) /
                                              std::max(1e-12, std::abs(ref.last_loss)));
  }
  const double mib = 1024.0 * 1024.0;
  std::printf("| %-26s | %6.3fx | %.3f-%.3f | %9.1f | %9.1f | %6.3fx | %.1e |\n", w.name.c_str(),
              median(ratios), *std::min_element(ratios.begin(), ratios.end()),
              *std::max_element(ratios.begin(), ratios.end()), ref.peak_bytes / mib,
              ours.peak_bytes / mib, static_cast<double>(ours.peak_bytes) / ref.peak_bytes,
              max_loss_gap);
  std::fflush(stdout);
}

std::vector<Workload> workloads(bool quick) {
  const int64_t s = quick ? 4 : 1;  // --quick: same shapes, scaled down, for a smoke run
  std::vector<Workload> w;
  {
    const int64_t batch = 16 / s, width = 64 / s;
    w.push_back({"resnet18 32x32 b" + std::to_string(batch),
                 [=] { return std::make_shared<ResNet>(ResNetOptions{18, width, {}, 3, 10, true}); },
                 at::randn({batch, 3, 32, 32}), at::randint(10, {batch}, at::kLong)});
  }
  {
    const int64_t batch = 8 / s, t = 128 / s, d = 256 / s;
    w.push_back({"gpt 6L d" + std::to_string(d) + " T" + std::to_string(t) + " b" + std::to_string(batch),
                 [=] { return std::make_shared<Decoder>(DecoderOptions::gpt2(256, t, 6, 8, d, 0.1)); },
                 at::randint(256, {batch, t}, at::kLong), at::randint(256, {batch, t}, at::kLong)});
  }
  {
    const int64_t batch = 256 / s, hidden = 1024 / s;
    w.push_back({"mlp 784-" + std::to_string(hidden) + "x2 b" + std::to_string(batch),
                 [=] { return std::make_shared<Mlp>(MlpOptions{784, {hidden, hidden}, 10, 0.1}); },
                 at::randn({batch, 784}), at::randint(10, {batch}, at::kLong)});
  }
  return w;
}

// What a GPU is measured on: ResNet-50 at 224x224 and a GPT the size of GPT-2 small.
std::vector<Workload> gpu_workloads(bool quick) {
  const int64_t s = quick ? 4 : 1;
  std::vector<Workload> w;
  {
    const int64_t batch = 64 / s, size = 224 / s;
    w.push_back({"resnet50 " + std::to_string(size) + "x" + std::to_string(size) + " b" + std::to_string(batch),
                 [] { return std::make_shared<ResNet>(ResNetOptions{50, 64, {}, 3, 1000, false}); },
                 at::randn({batch, 3, size, size}), at::randint(1000, {batch}, at::kLong)});
  }
  {
    const int64_t batch = 8 / s, t = 1024 / s, d = 768 / s, vocab = 50257;
    w.push_back({"gpt2-small T" + std::to_string(t) + " b" + std::to_string(batch),
                 [=] { return std::make_shared<Decoder>(DecoderOptions::gpt2(vocab, t, 12, 12, d, 0.1)); },
                 at::randint(vocab, {batch, t}, at::kLong), at::randint(vocab, {batch, t}, at::kLong)});
  }
  return w;
}

// Interpreter overhead per op: a chain of tiny adds, so that kernel time is negligible.
void op_overhead() {
  constexpr int kOps = 20000;
  const at::Tensor one = at::ones({1});
  auto time_us = [](auto&& body) {
    std::vector<double> us;
    for (int rep = 0; rep < 7; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      body();
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / kOps);
    }
    return median(us);
  };
  const double aten = time_us([&] {
    at::Tensor y = one;
    for (int i = 0; i < kOps; ++i) y = at::add(y, 1.0);
  });
  const double no_tape = time_us([&] {
    Interpreter interp;
    NoGradGuard no_grad(interp);
    Tensor y = interp.input(one);
    for (int i = 0; i < kOps; ++i) y = add(y, 1.0);
  });
  at::Tensor w = at::ones({1}).requires_grad_(true);
  const double with_tape = time_us([&] {
    Interpreter interp;
    Tensor y = interp.param(w);
    for (int i = 0; i < kOps; ++i) y = add(y, 1.0);
    interp.backward(y);
    w.mutable_grad() = at::Tensor();
  });
  const double autograd = time_us([&] {
    at::Tensor y = w;
    for (int i = 0; i < kOps; ++i) y = at::add(y, 1.0);
    y.backward();
    w.mutable_grad() = at::Tensor();
  });
  std::printf("\nper-op cost on a 1-element tensor (us/op, median of 7 chains of %d adds):\n", kOps);
  std::printf("  forward:            ATen call %.2f, interpreter %.2f\n", aten, no_tape);
  std::printf("  forward + backward: libtorch autograd %.2f, interpreter with tape %.2f\n", autograd, with_tape);
}

}  // namespace
}  // namespace ht::bench

int main(int argc, char** argv) {
  CLI::App app{"Training step: hybrid_train's interpreter vs. libtorch autograd (CPU, or a GPU)"};
  int reps = 7, warmup = 2;
  bool quick = false, keep_freed = false;
  std::string only;
  ht::bench::StepOptions steps{reps, warmup, 0};
  ht::bench::add_step_options(app, steps);
  app.add_option("--model", only, "run only workloads whose name starts with this");
  app.add_flag("--quick", quick, "scaled-down shapes, for a smoke run");
  std::string device = "cpu";
  app.add_option("--device", device, "cpu, or cuda: ResNet-50 at 224 and a GPT-2-small-sized GPT on the GPU")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_flag("--keep-freed-memory", keep_freed,
               "tell glibc to keep freed memory in the process (no re-faulting of returned pages), "
               "as a caching allocator does");
  CLI11_PARSE(app, argc, argv);

  if (keep_freed) {
    mallopt(M_MMAP_THRESHOLD, 256 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  }
  if (device == "cuda" && !at::hasCUDA()) {
    std::fprintf(stderr, "bench_step_vs_autograd: --device cuda: no GPU is visible, or this libtorch has no CUDA\n");
    return 2;
  }
  ht::bench::g_device = at::Device(device);
  if (device == "cuda") ht::use_deterministic_cuda_kernels();  // as hybrid_train does on a GPU, both sides
  ht::CpuAllocationCounter::install();
  reps = steps.reps;
  warmup = steps.warmup;
  const ht::ThreadPools pools = ht::bench::use_threads(steps.threads);
  at::manual_seed(0);
  std::printf("step time and peak memory, interpreter / libtorch autograd on %s; %d reps after %d warm-up, "
              "threads %s, glibc %s freed memory\n\n",
              device.c_str(), reps, warmup, pools.describe().c_str(), keep_freed ? "keeps" : "returns (default)");
  std::printf("| %-26s | %7s | %-11s | %9s | %9s | %7s | %7s |\n", "model", "time", "(min-max)",
              "peak MiB", "peak MiB", "memory", "loss");
  std::printf("| %-26s | %7s | %-11s | %9s | %9s | %7s | %7s |\n", "", "ratio", "", "autograd",
              "ours", "ratio", "rel gap");
  std::printf("|%s|\n", std::string(97, '-').c_str());
  for (const auto& w : device == "cuda" ? ht::bench::gpu_workloads(quick) : ht::bench::workloads(quick)) {
    if (!only.empty() && w.name.rfind(only, 0) != 0) continue;
    ht::bench::run(w, warmup, reps);
  }
  if (only.empty() && device == "cpu") ht::bench::op_overhead();
  return 0;
}

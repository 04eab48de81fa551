// Mixed precision, gradient accumulation and DTR, alone and combined, against the plain fp32
// step with the same global batch (4x the workload's base batch), in one process. For each
// configuration: its own unoptimized peak device memory (parameters, gradients, optimizer state,
// batch and activations, in an arena it never fills) and that peak's ratio to the plain step's;
// then its step interleaved with the plain one (A B, B A, ...) for the step-time ratio (median,
// min-max). DTR rows train the same configuration in a budget of its fixed memory plus
// --dtr-ratio of its activations, and their losses must equal the configuration's without DTR.
#include "bench/bench_main.h"
#include "bench/budget_runner.h"
#include "runtime/thread_pools.h"

#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <thread>

namespace ht::bench {
namespace {

// Rows whose budgeted run lost bit-identity with the run without a budget: a correctness failure.
int g_different_rows = 0;

struct Options {
  int warmup = 1, reps = 5;
  double dtr_ratio = 0.5;
};

struct Config {
  const char* precision;
  Savers savers;
  bool dtr;
};

// Peak and fixed memory of a configuration without a budget, and its first losses.
struct Measured {
  Unoptimized memory;
  std::vector<double> losses;
};

Measured measure(const Workload& w, int64_t batch, const Savers& savers, int steps) {
  BudgetRunner r(w, batch, unlimited_bytes(), std::nullopt, MemoryOptions{}.eviction_threshold, savers);
  Measured m;
  for (int i = 0; i < steps; ++i) m.losses.push_back(r.step().loss);
  m.memory = r.unoptimized();
  return m;
}

void row(const Workload& w, int64_t batch, const Config& c, const Measured& plain, const Options& o) {
  const Measured own = measure(w, batch, c.savers, std::max(2, o.warmup + o.reps));
  const int64_t budget = c.dtr ? own.memory.budget_at(o.dtr_ratio) : unlimited_bytes();
  std::vector<double> times, recompute;
  // Without DTR the configuration's unoptimized peak; with it, what its arena reached.
  int64_t peak = c.dtr ? 0 : own.memory.peak_in_use;
  std::string losses = "-";
  try {
    BudgetRunner base(w, batch, unlimited_bytes(), std::nullopt);
    BudgetRunner runner(w, batch, budget, c.dtr ? std::optional(EvictionHeuristic::kDtr) : std::nullopt,
                        MemoryOptions{}.eviction_threshold, c.savers);
    bool identical = true;
    size_t step = 0;  // the runner's losses must be the configuration's without a budget, step by step
    auto check = [&](const StepSample& b) { identical &= b.loss == own.losses[step++]; };
    for (int i = 0; i < o.warmup; ++i) {
      base.step();
      check(runner.step());
    }
    interleaved(base, runner, o.reps, [&](const StepSample& a, const StepSample& b) {
      check(b);
      times.push_back(b.ms / a.ms);
      recompute.push_back(b.recompute_ms / b.ms);
      if (c.dtr) peak = std::max(peak, b.peak_in_use);
    });
    if (c.dtr) losses = identical ? "identical" : "DIFFERENT";
    if (!identical) ++g_different_rows;
  } catch (const OutOfBudget& e) {
    std::printf("| %-4s | %5lld | %-6.1f | infeasible: %s |\n", c.precision,
                static_cast<long long>(c.savers.micro_batches), static_cast<double>(budget) / (1 << 20), e.what());
    return;
  }
  char budget_text[32] = "-";
  if (c.dtr) std::snprintf(budget_text, sizeof budget_text, "%.1f", static_cast<double>(budget) / (1 << 20));
  std::printf("| %-4s | %5lld | %-6s | %9.1f | %6.3fx | %7.3fx | %.3f-%.3f | %8.1f%% | %-9s |\n", c.precision,
              static_cast<long long>(c.savers.micro_batches), budget_text, peak / 1048576.0,
              static_cast<double>(peak) / static_cast<double>(plain.memory.peak_in_use), median(times),
              *std::min_element(times.begin(), times.end()), *std::max_element(times.begin(), times.end()),
              100 * median(recompute), losses.c_str());
  std::fflush(stdout);
}

void run(const Workload& w, const Options& o) {
  const int64_t batch = 4 * w.batch;
  const Measured plain = measure(w, batch, Savers{}, std::max(2, o.warmup + 1));
  std::printf("\n%s, global batch %lld: plain fp32 peak %.1f MiB (fixed %.1f MiB); DTR budget = fixed + %.2f x "
              "activations of the same configuration\n\n",
              w.name.c_str(), static_cast<long long>(batch), plain.memory.peak_in_use / 1048576.0,
              plain.memory.fixed_bytes / 1048576.0, o.dtr_ratio);
  std::printf("| %-4s | %5s | %-6s | %9s | %7s | %8s | %-11s | %9s | %-9s |\n", "type", "accum", "DTR", "peak MiB",
              "peak", "step", "(min-max)", "recompute", "losses vs");
  std::printf("| %-4s | %5s | %-6s | %9s | %7s | %8s | %-11s | %9s | %-9s |\n", "", "", "budget", "", "ratio",
              "time", "", "share", "no DTR");
  std::printf("|%s|\n", std::string(97, '-').c_str());
  for (bool dtr : {false, true}) {
    for (int64_t accum : {1, 4}) {
      for (const char* precision : {"fp32", "bf16"}) {
        const std::optional<at::ScalarType> autocast =
            std::string(precision) == "bf16" ? std::optional(at::kBFloat16) : std::nullopt;
        row(w, batch, Config{precision, Savers{autocast, accum}, dtr}, plain, o);
      }
    }
  }
}

}  // namespace
}  // namespace ht::bench

int main(int argc, char** argv) {
  CLI::App app{"Mixed precision, gradient accumulation and DTR against the plain fp32 step (CPU arena)"};
  ht::bench::Options o;
  bool quick = false;
  std::string only;
  ht::bench::StepOptions steps{o.reps, o.warmup, 1};
  ht::bench::add_step_options(app, steps);
  app.add_option("--model", only, "run only workloads whose name starts with this");
  app.add_option("--dtr-ratio", o.dtr_ratio, "DTR budget: fixed memory + this share of the activations")
      ->check(CLI::Range(0.05, 1.0));
  app.add_flag("--quick", quick, "scaled-down shapes, for a smoke run");
  CLI11_PARSE(app, argc, argv);
  ht::CpuAllocationCounter::install();
  o.reps = steps.reps;
  o.warmup = steps.warmup;
  const ht::ThreadPools pools = ht::bench::use_threads(steps.threads);
  std::printf("memory savers vs. the plain fp32 step with the same global batch; %d reps after %d warm-up, "
              "threads %s\n", o.reps, o.warmup, pools.describe().c_str());
  for (const auto& w : ht::bench::workloads(quick)) {
    if (!only.empty() && w.name.rfind(only, 0) != 0) continue;
    ht::bench::run(w, o);
  }
  if (ht::bench::g_different_rows > 0) {
    std::fprintf(stderr, "bench_memory_savers: %d row(s) trained DIFFERENT losses from the same configuration "
                 "without a budget\n", ht::bench::g_different_rows);
    return 1;
  }
  return 0;
}

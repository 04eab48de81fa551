// Host swap against recomputation, in one process. For each model, each link bandwidth (the
// modelled PCIe link of the CPU arena, memory.host_link_gbps) and each budget ratio (of the
// activation memory, on top of the fixed memory: the DTR paper's convention), each policy's
// training step interleaved with the unbudgeted one (A B, B A, ...):
//   dtr     recompute only (the link plays no part: one row per ratio);
//   static  a static plan of the repeating step (recompute only, solved; DTR outside it);
//   swap    vDNN: copies around convolutions and matmuls, DTR only when nothing is left to swap;
//   hybrid  Capuchin: swap what the link hides under forward, recompute the rest;
//   swap+state, hybrid+state: the same, with the optimizer state waiting on host between steps
//           (memory.optimizer_state = "host"), against the same budget.
// Columns: slowdown (median step-time ratio), recompute share of the step, MiB copied out per
// step, the share of bytes copied back that were there before their read (hidden), the link's
// rate while busy against the configured one, and bit-identity of the losses with the unbudgeted
// run (a difference is a failure: exit 1). Then, per model and link at the smallest ratio,
// hybrid against the better of swap-only and recompute-only (hybrid+state against swap+state and
// recompute-only); and the largest batch that trains
// with hybrid in the budget the base batch needs unbudgeted, against none.
#include "alloc/cuda_arena.h"
#include "alloc/cuda_host_link.h"
#include "bench/bench_main.h"
#include "bench/budget_runner.h"
#include "runtime/determinism.h"
#include "runtime/thread_pools.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>

namespace ht::bench {
namespace {

int g_different_rows = 0;

struct Options {
  int warmup = 2, reps = 3;
  std::vector<double> ratios{0.5, 0.3, 0.2};
  std::vector<double> links{25, 8};
  // "+state": the optimizer state waits on host between steps (memory.optimizer_state = "host").
  std::vector<std::string> policies{"dtr", "static", "swap", "hybrid", "swap+state", "hybrid+state"};
  double solve_time_s = 2;
  bool max_batch = true;
};

bool linked(const std::string& policy) { return policy.rfind("swap", 0) == 0 || policy.rfind("hybrid", 0) == 0; }

Savers savers_for(const std::string& policy, double gbps, const Options& o) {
  Savers s;
  if (policy == "static") {
    StaticPlanOptions plans;
    plans.solve_time_limit_s = o.solve_time_s;
    s.static_plans = plans;
  } else if (linked(policy)) {
    SwapOptions swap;
    swap.rule = policy.rfind("swap", 0) == 0 ? SwapRule::kConvAndMatmul : SwapRule::kHidden;
    s.optimizer_state_on_host = policy.find("+state") != std::string::npos;
    // On a GPU its own link (copy streams, measured rate); on CPU ranks the modelled one.
    const at::Device device = bench_device();
    swap.link = device.is_cuda() ? make_cuda_host_link(std::max<int>(0, device.index()))
                                 : std::shared_ptr<HostLink>(std::make_shared<ModelledHostLink>(gbps));
    swap.host_budget_bytes = int64_t{8} << 30;
    s.swap = swap;
  }
  return s;
}

struct Row {
  bool fits = false;
  double slowdown = 0, recompute_share = 0, recomputations = 0, out_mib = 0, hidden = -1, link_rate = -1;
  bool identical = true;
};

Row measure_row(const Workload& w, int64_t budget, const std::string& policy, double gbps, const Options& o) {
  Row row;
  BudgetRunner plain(w, w.batch, unlimited_bytes(), std::nullopt);
  BudgetRunner run(w, w.batch, budget, EvictionHeuristic::kDtr, MemoryOptions{}.eviction_threshold,
                   savers_for(policy, gbps, o));
  std::vector<double> ratios, recompute, recomputations;
  double out = 0, in = 0, hidden = 0, busy = 0, link_bytes = 0;
  try {
    for (int i = 0; i < o.warmup; ++i) row.identical &= plain.step().loss == run.step().loss;
    interleaved(plain, run, o.reps, [&](const StepSample& a, const StepSample& b) {
      row.identical &= a.loss == b.loss;
      ratios.push_back(b.ms / a.ms);
      recompute.push_back(b.recompute_ms / b.ms);
      recomputations.push_back(static_cast<double>(b.recomputations));
      out += static_cast<double>(b.swap_out_bytes);
      in += static_cast<double>(b.swap_in_bytes);
      hidden += static_cast<double>(b.swap_in_hidden_bytes);
      busy += b.link_busy_ms;
      link_bytes += static_cast<double>(b.link_bytes);
    });
  } catch (const OutOfBudget&) {
    return row;
  }
  row.fits = true;
  row.slowdown = median(ratios);
  row.recompute_share = median(recompute);
  row.recomputations = median(recomputations);
  row.out_mib = out / o.reps / (1 << 20);
  if (in > 0) row.hidden = hidden / in;
  if (busy > 0 && gbps > 0) row.link_rate = link_bytes / busy / (gbps * 1e6);
  if (!row.identical) ++g_different_rows;
  return row;
}

void print_row(const Workload& w, double ratio, const std::string& policy, const std::string& link, int64_t budget,
               const Row& r) {
  if (!r.fits) {
    std::printf("| %-22s | %5.2f | %-12s | %6s | %8.1f | does not fit |\n", w.name.c_str(), ratio, policy.c_str(),
                link.c_str(), budget / 1048576.0);
    return;
  }
  auto pct = [](double v) {
    char s[16];
    if (v < 0) return std::string("-");
    std::snprintf(s, sizeof s, "%.0f%%", 100 * v);
    return std::string(s);
  };
  std::printf("| %-22s | %5.2f | %-12s | %6s | %8.1f | %7.3fx | %8.1f%% | %7.0f | %8.1f | %6s | %6s | %-9s |\n",
              w.name.c_str(), ratio, policy.c_str(), link.c_str(), budget / 1048576.0, r.slowdown,
              100 * r.recompute_share, r.recomputations, r.out_mib, pct(r.hidden).c_str(), pct(r.link_rate).c_str(),
              r.identical ? "identical" : "DIFFERENT");
  std::fflush(stdout);
}

// Largest batch (doubling from `start`) whose two steps train in `budget` with `policy`.
int64_t max_batch(const Workload& w, int64_t budget, const std::string& policy, double gbps, int64_t start,
                  const Options& o) {
  auto fits = [&](int64_t batch) {
    try {
      const bool none = policy == "none";
      BudgetRunner r(w, batch, budget, none ? std::nullopt : std::optional(EvictionHeuristic::kDtr),
                     MemoryOptions{}.eviction_threshold, none ? Savers{} : savers_for(policy, gbps, o));
      r.step();
      r.step();
      return true;
    } catch (const OutOfBudget&) {
      return false;
    }
  };
  int64_t good = 0;
  for (int64_t b = start; b <= 64 * start && fits(b); b *= 2) good = b;
  return good;
}

void max_batch_row(const Workload& w, const Unoptimized& u, const Options& o) {
  const int64_t budget = u.peak_in_use + u.peak_in_use / 10;
  const double gbps = o.links.front();
  const int64_t none = max_batch(w, budget, "none", gbps, w.batch, o);
  const int64_t hybrid = max_batch(w, budget, "hybrid", gbps, std::max<int64_t>(none, 1), o);
  if (none == 0 || hybrid == 0) {
    std::printf("| %-22s | %8.1f | %5lld | %6lld | (no batch fits) |\n", w.name.c_str(), budget / 1048576.0,
                static_cast<long long>(none), static_cast<long long>(hybrid));
    return;
  }
  auto per_sample = [&](int64_t batch) {
    std::vector<double> ratios;
    try {
      BudgetRunner a(w, none, budget, std::nullopt);
      BudgetRunner b(w, batch, budget, EvictionHeuristic::kDtr, MemoryOptions{}.eviction_threshold,
                     savers_for("hybrid", gbps, o));
      for (int i = 0; i < o.warmup; ++i) {
        a.step();
        b.step();
      }
      interleaved(a, b, o.reps, [&](const StepSample& sa, const StepSample& sb) {
        ratios.push_back((static_cast<double>(batch) / sb.ms) / (static_cast<double>(none) / sa.ms));
      });
    } catch (const OutOfBudget&) {
      ratios.clear();
    }
    char cell[48];
    std::snprintf(cell, sizeof cell, ratios.empty() ? "(did not fit)" : "%.3fx", ratios.empty() ? 0.0 : median(ratios));
    return std::string(cell);
  };
  const std::string at_four = 4 * none <= hybrid ? per_sample(4 * none) : "(beyond hybrid's largest)";
  std::printf("| %-22s | %8.1f | %5lld | %6lld | %5.1fx | %-14s | %-14s |\n", w.name.c_str(), budget / 1048576.0,
              static_cast<long long>(none), static_cast<long long>(hybrid),
              static_cast<double>(hybrid) / static_cast<double>(none), per_sample(hybrid).c_str(), at_four.c_str());
  std::fflush(stdout);
}

void run(const Workload& w, const Options& o) {
  BudgetRunner plain(w, w.batch, unlimited_bytes(), std::nullopt);
  for (int i = 0; i < 3; ++i) plain.step();
  const Unoptimized u = plain.unoptimized();
  std::printf("\n%s: fixed %.1f MiB, unbudgeted peak %.1f MiB, activations %.1f MiB\n\n", w.name.c_str(),
              u.fixed_bytes / 1048576.0, u.peak_in_use / 1048576.0, (u.peak_in_use - u.fixed_bytes) / 1048576.0);
  std::printf("| %-22s | %5s | %-12s | %6s | %8s | %8s | %9s | %7s | %8s | %6s | %6s | %-9s |\n", "model", "ratio",
              "policy", "GB/s", "budget", "slowdown", "recompute", "kernels", "MiB out", "hidden", "link", "losses");
  std::printf("|%s|\n", std::string(140, '-').c_str());
  std::map<std::pair<double, double>, std::map<std::string, Row>> rows;  // (ratio, link) -> policy -> row
  for (double ratio : o.ratios) {
    const int64_t budget = u.budget_at(ratio);
    for (const std::string& policy : o.policies) {
      const bool linked = bench::linked(policy);
      for (double gbps : o.links) {
        const Row r = measure_row(w, budget, policy, gbps, o);
        print_row(w, ratio, policy, linked ? std::to_string(static_cast<int>(gbps)) : "-", budget, r);
        if (!linked) {
          for (double l : o.links) rows[{ratio, l}][policy] = r;  // recompute-only rows serve every link
          break;
        }
        rows[{ratio, gbps}][policy] = r;
      }
    }
  }
  const double smallest = *std::min_element(o.ratios.begin(), o.ratios.end());
  for (double gbps : o.links) {
    auto& at = rows[{smallest, gbps}];
    for (const std::string hybrid : {"hybrid", "hybrid+state"}) {
      if (!at.count(hybrid)) continue;
      // Against recompute-only, and swap-only with the optimizer state where hybrid has it.
      const std::string swap = hybrid == "hybrid" ? "swap" : "swap+state";
      if (!at.count(swap) || !at.count("dtr")) continue;
      double best = 1e30;
      for (const Row* r : {&at[swap], &at["dtr"]})
        if (r->fits) best = std::min(best, r->slowdown);
      const Row& h = at[hybrid];
      std::printf("%s at %.2f, %.0f GB/s: %s %.3fx vs the better of swap-only and recompute-only %s: %s\n",
                  w.name.c_str(), smallest, gbps, hybrid.c_str(), h.slowdown,
                  best < 1e30 ? (std::to_string(best).substr(0, 5) + "x").c_str() : "(neither fits)",
                  !h.fits ? "does not fit" : h.slowdown < best ? (best < 1e30 ? "faster" : "fits where neither does")
                                                               : "NOT faster");
    }
  }
}

std::vector<double> numbers(const std::string& text) {
  std::vector<double> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) out.push_back(std::stod(item));
  return out;
}

}  // namespace
}  // namespace ht::bench

int main(int argc, char** argv) {
  CLI::App app{"Host swap (swap, hybrid) against recomputation (dtr, static) under a budget, vs unbudgeted"};
  ht::bench::Options o;
  ht::bench::StepOptions steps{o.reps, o.warmup, 1};
  bool quick = false, no_max_batch = false, only_max_batch = false;
  std::string only, ratios = "0.5,0.3,0.2", links = "25,8", policies, device = "cpu";
  ht::bench::add_step_options(app, steps);
  app.add_option("--device", device, "cpu, or cuda: ResNet-50 at 224 and a GPT-2-small-sized GPT in an arena on the "
                                     "GPU, copies over its own link (--links is then its measured rate)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--model", only, "run only workloads whose name starts with this");
  app.add_option("--ratios", ratios, "comma-separated budget ratios (of activation memory)");
  app.add_option("--links", links, "comma-separated link bandwidths, GB/s each way");
  app.add_option("--policies", policies, "comma-separated: dtr, static, swap, hybrid, swap+state, hybrid+state "
                                         "(+state: the optimizer state waits on host between steps)");
  app.add_option("--solve-time", o.solve_time_s, "static plans: the solver's time limit per plan, s");
  app.add_flag("--quick", quick, "scaled-down shapes, for a smoke run");
  app.add_flag("--no-max-batch", no_max_batch, "skip the largest-batch search");
  app.add_flag("--only-max-batch", only_max_batch, "only the largest-batch search");
  CLI11_PARSE(app, argc, argv);
  o.reps = steps.reps;
  o.warmup = steps.warmup;
  try {
    o.ratios = ht::bench::numbers(ratios);
    o.links = ht::bench::numbers(links);
  } catch (const std::exception&) {
    std::fprintf(stderr, "bench_host_swap: --ratios and --links take comma-separated numbers, e.g. 0.5,0.3\n");
    return 2;
  }
  if (!policies.empty()) {
    o.policies.clear();
    std::stringstream in(policies);
    for (std::string item; std::getline(in, item, ',');) {
      if (item != "dtr" && item != "static" && item != "swap" && item != "hybrid" && item != "swap+state" &&
          item != "hybrid+state") {
        std::fprintf(stderr, "bench_host_swap: --policies: unknown policy \"%s\"; use dtr, static, swap, hybrid, "
                             "swap+state or hybrid+state\n", item.c_str());
        return 2;
      }
      o.policies.push_back(item);
    }
  }
  o.max_batch = !no_max_batch;
  if (device == "cuda") {
    if (!(at::hasCUDA() && ht::cuda_budgets_built())) {
      std::fprintf(stderr, "bench_host_swap: --device cuda: %s\n",
                   ht::cuda_budgets_built() ? "no GPU is visible" : ht::cuda_budgets_missing().c_str());
      return 2;
    }
    ht::bench::bench_device() = at::Device(device);
    ht::use_deterministic_cuda_kernels();  // as hybrid_train does on a GPU
    o.links = {ht::cuda_host_link_gbps(0)};  // the link the copies take, measured
  }
  ht::CpuAllocationCounter::install();
  const ht::ThreadPools pools = ht::bench::use_threads(steps.threads);
  std::printf("host swap vs recomputation under a budget; %d reps after %d warm-up, threads %s; memcpy here %.1f GB/s\n",
              o.reps, o.warmup, pools.describe().c_str(), ht::measure_memcpy_gbps());
  const auto workloads = device == "cuda" ? ht::bench::gpu_workloads(quick) : ht::bench::workloads(quick);
  for (const auto& w : workloads) {
    if (only_max_batch || (!only.empty() && w.name.rfind(only, 0) != 0)) continue;
    ht::bench::run(w, o);
  }
  if (o.max_batch) {
    std::printf("\nlargest batch at the budget the unbudgeted base batch needs + 10%% (none vs hybrid at %.0f GB/s), "
                "per-sample throughput hybrid / none:\n\n| %-22s | %8s | %5s | %6s | %6s | %-14s | %-14s |\n|%s|\n",
                o.links.front(), "model", "budget", "none", "hybrid", "batch", "at hybrid max", "at 4x none",
                std::string(100, '-').c_str());
    for (const auto& w : workloads) {
      if (!only.empty() && w.name.rfind(only, 0) != 0) continue;
      ht::bench::BudgetRunner plain(w, w.batch, ht::bench::unlimited_bytes(), std::nullopt);
      for (int i = 0; i < 3; ++i) plain.step();
      ht::bench::max_batch_row(w, plain.unoptimized(), o);
    }
  }
  if (ht::bench::g_different_rows > 0) {
    std::fprintf(stderr, "bench_host_swap: %d row(s) trained DIFFERENT losses from the run without a budget\n",
                 ht::bench::g_different_rows);
    return 1;
  }
  return 0;
}

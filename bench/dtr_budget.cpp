// DTR under a budget against the unoptimized run, in one process. For each model: the
// unoptimized step's fixed memory (parameters, gradients' home, optimizer state) and peak; then,
// for each budget ratio (of the activation memory, on top of the fixed memory: the DTR paper's
// convention with everything inside the budget) and each eviction policy, the same training
// step interleaved with the unoptimized one (A B, B A, ...): slowdown (median step-time ratio,
// min-max), recompute share of the step, evictions per step, peak / budget; the losses of both
// sides must agree bit for bit. Then the largest batch that trains at a fixed budget without and
// with DTR, and the per-sample throughput ratio. With --peer: PyTorch's rows (its own medians),
// then our unbudgeted step step for step with PyTorch eager in one invocation (each side first
// every other pair, the same warm-up; on a GPU deterministic against deterministic, then against
// PyTorch's default mode), and DTR in torch.utils.checkpoint's peak step for step with it.
#include "bench/bench_main.h"
#include "bench/budget_runner.h"
#include "bench/peer_rows.h"
#include "alloc/cuda_arena.h"
#include "runtime/determinism.h"
#include "runtime/thread_pools.h"

#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <thread>

namespace ht::bench {
namespace {

// Rows whose budgeted run lost bit-identity with the run without a budget: a correctness failure.
int g_different_rows = 0;

struct Options {
  int warmup = 1, reps = 5;
  std::vector<double> ratios{0.8, 0.5, 0.3, 0.2};
  std::vector<std::string> policies{"dtr", "dtr_eq", "megengine", "lru", "largest"};
  // What DTR's policies weigh: modeled kernel costs (the default), measured times, or both side by side.
  std::vector<KernelCosts> costs{KernelCosts::kModeled};
  // Whether a request that finds no block evicts Coop's cheapest window (on), or the policy's
  // favourites one by one (off); both: side by side.
  std::vector<bool> windows{true};
  bool max_batch = true;
  double threshold = MemoryOptions{}.eviction_threshold;
  std::string peer;  // a Python that runs bench/peer/gpu_peer.py; empty: no peer rows
  std::string peer_script = "bench/peer/gpu_peer.py";
  int threads = 1;
};

// What the run without a budget measured, for the peer's rows.
struct Baseline {
  double step_ms = 0;
  int64_t peak_in_use = 0;
};

// One (ratio, policy, costs) row: B under the budget interleaved with A unoptimized.
void budget_row(const Workload& w, const Unoptimized& u, double ratio, const std::string& policy_name,
                KernelCosts costs, bool window, const Options& o) {
  const int64_t budget = u.budget_at(ratio);
  // Both sides start from the same initialization, so their losses must agree at every step.
  BudgetRunner plain(w, w.batch, unlimited_bytes(), std::nullopt);
  Savers savers;
  savers.kernel_costs = costs;
  savers.eviction_window = window;
  const EvictionHeuristic heuristic = *parse_choice<EvictionHeuristic>(policy_name);  // checked by the options
  BudgetRunner dtr(w, w.batch, budget, heuristic, o.threshold, savers);
  // The costs a policy weighs, and whether it evicts windows, are named when the run compares them.
  std::string policy = policy_name;
  if (o.costs.size() > 1 && weighs_costs(heuristic)) policy += "/" + std::string(choice_name(costs));
  if (o.windows.size() > 1 && weighs_costs(heuristic)) policy += window ? "/window" : "/single";
  std::vector<double> ratios, recompute_share, evictions, peaks, windowed, fragmentation;
  bool identical = true;
  try {
    for (int i = 0; i < o.warmup; ++i) {
      const StepSample a = plain.step(), b = dtr.step();
      identical &= a.loss == b.loss;
    }
    interleaved(plain, dtr, o.reps, [&](const StepSample& a, const StepSample& b) {
      identical &= a.loss == b.loss;
      ratios.push_back(b.ms / a.ms);
      recompute_share.push_back(b.recompute_ms / b.ms);
      evictions.push_back(static_cast<double>(b.evictions));
      peaks.push_back(static_cast<double>(b.peak_in_use) / static_cast<double>(budget));
      windowed.push_back(static_cast<double>(b.window_evictions));
      fragmentation.push_back(b.fragmentation);
    });
  } catch (const OutOfBudget& e) {
    std::printf("| %-24s | %5.2f | %-16s | %9.1f | infeasible: %s |\n", w.name.c_str(), ratio, policy.c_str(),
                static_cast<double>(budget) / (1 << 20), e.what());
    return;
  }
  if (!identical) ++g_different_rows;
  std::printf("| %-24s | %5.2f | %-16s | %9.1f | %7.3fx | %.3f-%.3f | %8.1f%% | %9.0f | %6.0f | %5.1f%% | %5.3f | %-9s |\n",
              w.name.c_str(), ratio, policy.c_str(), static_cast<double>(budget) / (1 << 20), median(ratios),
              *std::min_element(ratios.begin(), ratios.end()), *std::max_element(ratios.begin(), ratios.end()),
              100 * median(recompute_share), median(evictions), median(windowed), 100 * median(fragmentation),
              *std::max_element(peaks.begin(), peaks.end()), identical ? "identical" : "DIFFERENT");
  std::fflush(stdout);
}

// Largest batch, by doubling then bisection, whose step trains in `budget` (policy none or dtr).
int64_t max_batch(const Workload& w, int64_t budget, std::optional<EvictionHeuristic> policy, int64_t start,
                  const Options& o) {
  auto fits = [&](int64_t batch) {
    try {
      BudgetRunner r(w, batch, budget, policy, o.threshold);
      r.step();
      r.step();  // the second step is the first with optimizer state
      return true;
    } catch (const OutOfBudget&) {
      return false;
    }
  };
  int64_t good = 0, bad = start;
  while (fits(bad)) {
    good = bad;
    bad *= 2;
  }
  while (bad - good > std::max<int64_t>(1, good / 16)) {  // to 1/16 of the batch
    const int64_t mid = (good + bad) / 2;
    (fits(mid) ? good : bad) = mid;
  }
  return good;
}

// Per-sample throughput of DTR at `dtr_batch` over no eviction at `plain_batch`, both in
// `budget`, interleaved. Empty if the DTR batch does not train for warmup + reps steps.
std::vector<double> per_sample_ratios(const Workload& w, int64_t budget, int64_t plain_batch, int64_t dtr_batch,
                                      const Options& o) {
  try {
    BudgetRunner a(w, plain_batch, budget, std::nullopt), b(w, dtr_batch, budget, EvictionHeuristic::kDtr, o.threshold);
    for (int i = 0; i < o.warmup; ++i) {
      a.step();
      b.step();
    }
    std::vector<double> ratios;
    interleaved(a, b, o.reps, [&](const StepSample& sa, const StepSample& sb) {
      ratios.push_back((static_cast<double>(dtr_batch) / sb.ms) / (static_cast<double>(plain_batch) / sa.ms));
    });
    return ratios;
  } catch (const OutOfBudget&) {
    return {};
  }
}

std::string ratio_cell(const std::vector<double>& r) {
  if (r.empty()) return "(did not fit)";
  char text[64];
  std::snprintf(text, sizeof text, "%.3fx (%.3f-%.3f)", median(r), *std::min_element(r.begin(), r.end()),
                *std::max_element(r.begin(), r.end()));
  return text;
}

void max_batch_row(const Workload& w, const Unoptimized& u, const Options& o) {
  // What the unoptimized base batch needs, and 10% for fragmentation (its peak was measured in
  // an arena it could not fill, where no free memory is ever in the way).
  const int64_t budget = u.peak_in_use + u.peak_in_use / 10;
  const int64_t plain_batch = max_batch(w, budget, std::nullopt, w.batch, o);
  int64_t dtr_batch = max_batch(w, budget, EvictionHeuristic::kDtr, std::max<int64_t>(plain_batch, 1) * 2, o);
  if (plain_batch == 0 || dtr_batch == 0) {
    std::printf("| %-24s | %9.1f | %6lld | %6lld | (no batch fits) |\n", w.name.c_str(),
                static_cast<double>(budget) / (1 << 20), static_cast<long long>(plain_batch),
                static_cast<long long>(dtr_batch));
    return;
  }
  // The search ran two steps per batch; where blocks land varies with eviction choices, so a
  // batch at the edge may fail in a later step: then step down by 1/16 and measure again.
  std::vector<double> at_max;
  for (int attempt = 0; at_max.empty() && attempt < 4; ++attempt) {
    at_max = per_sample_ratios(w, budget, plain_batch, dtr_batch, o);
    if (at_max.empty()) dtr_batch -= std::max<int64_t>(1, dtr_batch / 16);
  }
  const int64_t triple = 3 * plain_batch;
  const std::vector<double> at_triple =
      triple <= dtr_batch ? per_sample_ratios(w, budget, plain_batch, triple, o) : std::vector<double>{};
  std::printf("| %-24s | %9.1f | %6lld | %6lld | %5.2fx | %-24s | %-24s |\n", w.name.c_str(),
              static_cast<double>(budget) / (1 << 20), static_cast<long long>(plain_batch),
              static_cast<long long>(dtr_batch), static_cast<double>(dtr_batch) / static_cast<double>(plain_batch),
              ratio_cell(at_max).c_str(), ratio_cell(at_triple).c_str());
  std::fflush(stdout);
}

Baseline run(const Workload& w, const Options& o) {
  BudgetRunner plain(w, w.batch, unlimited_bytes(), std::nullopt);
  // The optimizer state exists from the end of step 1: the peak is that of step 2 on.
  for (int i = 0; i < std::max(2, o.warmup + 1); ++i) plain.step();
  std::vector<double> plain_ms;
  for (int i = 0; i < o.reps && !o.peer.empty(); ++i) plain_ms.push_back(plain.step().ms);
  const Unoptimized u = plain.unoptimized();
  std::printf("\n%s: fixed %.1f MiB (parameters, gradients, optimizer state), unoptimized peak %.1f MiB, activations %.1f MiB\n\n",
              w.name.c_str(), u.fixed_bytes / 1048576.0, u.peak_in_use / 1048576.0,
              (u.peak_in_use - u.fixed_bytes) / 1048576.0);
  std::printf("| %-24s | %5s | %-16s | %9s | %8s | %-11s | %9s | %9s | %6s | %6s | %5s | %-9s |\n", "model", "ratio",
              "policy", "budget MiB", "slowdown", "(min-max)", "recompute", "evictions", "in", "frag.", "peak/",
              "losses");
  std::printf("| %-24s | %5s | %-16s | %9s | %8s | %-11s | %9s | %9s | %6s | %6s | %5s | %-9s |\n", "", "", "", "",
              "", "", "share", "per step", "window", "@peak", "budget", "");
  std::printf("|%s|\n", std::string(154, '-').c_str());
  for (double ratio : o.ratios) {
    for (const std::string& policy : o.policies) {
      const bool weighs = weighs_costs(*parse_choice<EvictionHeuristic>(policy));
      for (KernelCosts costs : o.costs) {
        for (bool window : o.windows) {
          budget_row(w, u, ratio, policy, costs, window, o);
          if (!weighs) break;  // the same row whatever the windows
        }
        if (!weighs) break;  // the same row whatever the costs
      }
    }
  }
  return {plain_ms.empty() ? 0.0 : median(plain_ms), u.peak_in_use};
}

void at_the_peers_memory(const Workload& w, const PeerRow& checkpointed, const std::string& peer_args,
                         const Options& o);
void eager_pairs(const Workload& w, const std::string& peer_args, const Options& o, bool deterministic);

// After this process's runners are gone, so the peer has the device to itself.
void peer_rows(const Workload& w, const Baseline& ours, const Options& o) {
  if (o.peer.empty()) return;
  if (w.peer_args.empty()) {
    std::printf("\n%s: the peer has no such model\n", w.name.c_str());
    return;
  }
  const std::string args = w.peer_args + " --device " + bench_device().str() + " --steps " + std::to_string(o.reps) +
                           " --warmup " + std::to_string(std::max(1, o.warmup)) + " --threads " + std::to_string(o.threads);
  std::string failure;
  const std::vector<PeerRow> rows = run_peer(o.peer, o.peer_script, args, failure);
  if (rows.empty()) {
    std::printf("\n%s: the peer failed: %s\n", w.name.c_str(), failure.c_str());
    return;
  }
  print_peer_rows(w.name, ours.step_ms, ours.peak_in_use, rows);
  // Step for step, the same warm-up on both sides: deterministic kernels against deterministic
  // ones (as hybrid_train runs on a GPU), then against PyTorch's default mode.
  const std::string paired = w.peer_args + " --device " + bench_device().str() + " --threads " + std::to_string(o.threads);
  eager_pairs(w, paired, o, /*deterministic=*/true);
  if (bench_device().is_cuda()) eager_pairs(w, paired, o, /*deterministic=*/false);
  for (const PeerRow& r : rows) {
    if (r.mode == "checkpoint" && r.peak_bytes > 0) at_the_peers_memory(w, r, args, o);
  }
}

// `reps` steps of `runner` and of `peer`, each side first every other pair, so that the machine's
// drift falls on both; their milliseconds appended pair by pair (fewer where the peer failed).
void step_for_step(BudgetRunner& runner, PeerSession& peer, int reps, std::vector<double>& ours,
                   std::vector<double>& theirs) {
  for (int i = 0; i < reps && peer.ok(); ++i) {
    double mine = 0, peers = 0;
    if (i % 2 == 0) {
      mine = runner.step().ms;
      peers = peer.step();
    } else {
      peers = peer.step();
      mine = runner.step().ms;
    }
    if (!peer.ok()) break;
    ours.push_back(mine);
    theirs.push_back(peers);
  }
}

// Our unbudgeted step and the peer's eager one in one invocation, each first every other pair
// (issue 69's comparison: the machine's drift falls on both), after the same warm-up steps; the
// ratio is the median of the pairs'.
void eager_pairs(const Workload& w, const std::string& peer_args, const Options& o, bool deterministic) {
  const int warmup = std::max(2, o.warmup + 1);  // ours: the optimizer state exists from step 2 on
  const char* mode = deterministic ? "deterministic" : "PyTorch's default mode";
  std::vector<double> ours, theirs, ratios;
  BudgetRunner plain(w, w.batch, unlimited_bytes(), std::nullopt);
  PeerSession peer(o.peer, o.peer_script,
                   peer_args + " --modes eager --warmup " + std::to_string(warmup) +
                       (deterministic ? "" : " --nondeterministic"));
  for (int i = 0; peer.ok() && i < warmup; ++i) plain.step();
  step_for_step(plain, peer, o.reps, ours, theirs);
  for (size_t i = 0; i < ours.size(); ++i) ratios.push_back(ours[i] / theirs[i]);
  if (!peer.ok() || ratios.empty()) {
    std::printf("| hybrid_train step for step with PyTorch eager (%s) | the peer failed: %s |\n", mode,
                peer.failure().c_str());
    return;
  }
  std::printf("| %s: hybrid_train step for step with PyTorch eager (%s), %d warm-up steps each | %.2f ms | eager %.2f "
              "ms | our step over its %.3f (pairs %.3f-%.3f; issue 69's target: at most 0.90) |\n",
              w.name.c_str(), mode, warmup, median(ours), median(theirs), median(ratios),
              *std::min_element(ratios.begin(), ratios.end()), *std::max_element(ratios.begin(), ratios.end()));
  std::fflush(stdout);
}

// hybrid_train under DTR in the memory torch.utils.checkpoint's step peaked at (issue 34's
// target: 1.15x faster there), step for step against the peer's: a PeerSession takes one step
// of torch.utils.checkpoint for each of ours, each side first every other pair, so that the
// machine's drift (its second core makes steps bimodal) falls on both; the ratio is the median
// of the pairs'.
void at_the_peers_memory(const Workload& w, const PeerRow& checkpointed, const std::string& peer_args,
                         const Options& o) {
  const double mib = static_cast<double>(checkpointed.peak_bytes) / (1 << 20);
  std::vector<double> ours, theirs, ratios;
  try {
    BudgetRunner dtr(w, w.batch, checkpointed.peak_bytes, EvictionHeuristic::kDtr, o.threshold);
    PeerSession peer(o.peer, o.peer_script, peer_args + " --modes checkpoint");
    for (int i = 0; peer.ok() && i < std::max(2, o.warmup + 1); ++i) dtr.step();
    step_for_step(dtr, peer, o.reps, ours, theirs);
    for (size_t i = 0; i < ours.size(); ++i) ratios.push_back(theirs[i] / ours[i]);
    if (!peer.ok()) {
      std::printf("| hybrid_train, DTR in torch.utils.checkpoint's peak | the peer failed: %s |\n", peer.failure().c_str());
      return;
    }
  } catch (const OutOfBudget& e) {
    std::printf("| hybrid_train, DTR in torch.utils.checkpoint's peak (%.1f MiB) | infeasible: %s |\n", mib, e.what());
    return;
  }
  std::printf("| hybrid_train, DTR in torch.utils.checkpoint's peak (%.1f MiB), step for step with it | %.2f ms | "
              "torch.utils.checkpoint %.2f ms | its step over ours %.3f (pairs %.3f-%.3f; issue 34's target: at "
              "least 1.15) |\n",
              mib, median(ours), median(theirs), median(ratios), *std::min_element(ratios.begin(), ratios.end()),
              *std::max_element(ratios.begin(), ratios.end()));
  std::fflush(stdout);
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

}  // namespace
}  // namespace ht::bench

int main(int argc, char** argv) {
  CLI::App app{"DTR under a memory budget vs. the unoptimized training step (an arena on the CPU or the GPU)"};
  ht::bench::Options o;
  bool quick = false;
  std::string only, policies = "dtr,dtr_eq,megengine,lru,largest", ratios = "0.8,0.5,0.3,0.2", costs = "modeled", window = "on";
  ht::bench::StepOptions steps{o.reps, o.warmup, 1};
  ht::bench::add_step_options(app, steps);
  app.add_option("--model", only, "run only workloads whose name starts with this");
  app.add_option("--policies", policies, "comma-separated eviction policies");
  app.add_option("--ratios", ratios, "comma-separated budget ratios (of activation memory)");
  app.add_option("--costs", costs, "what the policies weigh, comma-separated: modeled, measured (both: side by side)");
  app.add_option("--window", window, "a request that finds no block evicts Coop's cheapest window: on, off, or "
                 "on,off (side by side)");
  app.add_option("--eviction-threshold", o.threshold, "evict before each op down to this share of the budget")
      ->check(CLI::Range(0.1, 1.0));
  app.add_flag("--quick", quick, "scaled-down shapes, for a smoke run");
  std::string device = "cpu";
  app.add_option("--device", device, "cpu, or cuda: ResNet-50 at 224 and a GPT-2-small-sized GPT in an arena on the GPU")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--peer", o.peer, "a Python with PyTorch: runs bench/peer/gpu_peer.py (eager, torch.utils.checkpoint) "
                 "on the same model and batch, rows beside ours (python3 on the GPU machine, /usr/bin/python3 here)");
  app.add_option("--peer-script", o.peer_script, "the peer's script, from where the benchmark runs");
  bool no_max_batch = false, only_max_batch = false;
  app.add_flag("--no-max-batch", no_max_batch, "skip the largest-batch search");
  app.add_flag("--only-max-batch", only_max_batch, "only the largest-batch search");
  CLI11_PARSE(app, argc, argv);
  o.policies = ht::bench::split(policies);
  for (const std::string& p : o.policies) {
    if (!ht::parse_choice<ht::EvictionHeuristic>(p)) {
      std::fprintf(stderr, "bench_dtr_budget: --policies: unknown policy \"%s\"; use dtr, dtr_eq, megengine, lru "
                   "or largest\n", p.c_str());
      return 2;
    }
  }
  o.costs.clear();
  for (const std::string& c : ht::bench::split(costs)) {
    const std::optional<ht::KernelCosts> k = ht::parse_choice<ht::KernelCosts>(c);
    if (!k) {
      std::fprintf(stderr, "bench_dtr_budget: --costs: unknown \"%s\"; use modeled, measured or both\n", c.c_str());
      return 2;
    }
    o.costs.push_back(*k);
  }
  o.windows.clear();
  for (const std::string& w : ht::bench::split(window)) {
    if (w != "on" && w != "off") {
      std::fprintf(stderr, "bench_dtr_budget: --window: unknown \"%s\"; use on, off or on,off\n", w.c_str());
      return 2;
    }
    o.windows.push_back(w == "on");
  }
  o.ratios.clear();
  for (const std::string& r : ht::bench::split(ratios)) o.ratios.push_back(std::stod(r));
  o.max_batch = !no_max_batch;

  if (device == "cuda" && !(at::hasCUDA() && ht::cuda_budgets_built())) {
    std::fprintf(stderr, "bench_dtr_budget: --device cuda: %s\n",
                 ht::cuda_budgets_built() ? "no GPU is visible" : ht::cuda_budgets_missing().c_str());
    return 2;
  }
  ht::bench::bench_device() = at::Device(device);
  if (device == "cuda") ht::use_deterministic_cuda_kernels();  // as hybrid_train does on a GPU
  ht::CpuAllocationCounter::install();
  o.reps = steps.reps;
  o.warmup = steps.warmup;
  const ht::ThreadPools pools = ht::bench::use_threads(steps.threads);
  o.threads = steps.threads > 0 ? steps.threads : ht::default_thread_count(1);
  std::printf("DTR under a budget vs. unoptimized on %s; %d reps after %d warm-up, threads %s, eviction "
              "threshold %.2f\n", device.c_str(), o.reps, o.warmup, pools.describe().c_str(), o.threshold);
  std::printf("budget = fixed + ratio x (unoptimized peak - fixed); parameters, gradients and optimizer state "
              "inside the budget\n");
  const auto workloads = device == "cuda" ? ht::bench::gpu_workloads(quick) : ht::bench::workloads(quick);
  for (const auto& w : workloads) {
    if (only_max_batch || (!only.empty() && w.name.rfind(only, 0) != 0)) continue;
    const ht::bench::Baseline ours = ht::bench::run(w, o);
    ht::bench::peer_rows(w, ours, o);
  }
  if (o.max_batch) {
    std::printf("\nlargest batch at the budget the unoptimized base batch needs + 10%% (policy none vs dtr), "
                "per-sample throughput ratio dtr / none:\n\n");
    std::printf("| %-24s | %9s | %6s | %6s | %6s | %-24s | %-24s |\n", "model", "budget MiB", "none", "dtr",
                "batch", "per-sample at dtr max", "per-sample at 3x none");
    std::printf("|%s|\n", std::string(124, '-').c_str());
    for (const auto& w : workloads) {
      if (!only.empty() && w.name.rfind(only, 0) != 0) continue;
      ht::bench::BudgetRunner plain(w, w.batch, ht::bench::unlimited_bytes(), std::nullopt);
      for (int i = 0; i < std::max(2, o.warmup + 1); ++i) plain.step();
      ht::bench::max_batch_row(w, plain.unoptimized(), o);
    }
  }
  if (ht::bench::g_different_rows > 0) {
    std::fprintf(stderr, "bench_dtr_budget: %d row(s) trained DIFFERENT losses from the run without a budget\n",
                 ht::bench::g_different_rows);
    return 1;
  }
  return 0;
}

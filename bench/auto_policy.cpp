// memory.policy = "auto" held against measurement (issue 34): a user sets only a budget, and the
// run check trains the policy the planner predicts fastest (launcher/planning/run_check.cpp). Here,
// per job and budget, hybrid_train runs with the budget alone (auto's choice, read from its log
// line with every candidate's predicted step), then with each candidate named: none, static, full,
// per_block and per_block with offload (each at the share its run check picks), dtr and hybrid,
// all in the same budget, each run twice a minute apart (the quiet step of both, as
// bench_planner_accuracy). The question: is auto's run within 5% of the fastest candidate
// measured? A run of auto's that fails, or any run whose peak passes the budget, is an error
// (exit 1); a slower pick is reported, not an error: timings on a shared machine vary.
#include "base/remove_tree.h"
#include "launcher/config/run_plan_of.h"
#include "bench/bench_util.h"
#include "bench/planner_rows.h"
#include "alloc/cpu_device_allocator.h"
#include "runtime/thread_pools.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <unistd.h>

namespace ht::bench {
namespace {

constexpr double kMiB = 1 << 20;
constexpr int64_t kRoomy = int64_t{1} << 30;
// auto's candidates, named as its log line names them.
struct Candidate {
  MemoryPolicy policy;
  bool state_on_host = false;
  double threshold = 0.9;  // memory.eviction_threshold
  bool offload = false;    // per_block: memory.block_offload
  std::string name() const {
    return std::string(choice_name(policy)) + (offload ? " with offload" : "") +
           (state_on_host ? " with the optimizer state on host" : "") + (threshold == 1.0 ? " evicting down to 100%" : "");
  }
  std::string stem() const {
    return std::string(choice_name(policy)) + (offload ? "_offload" : "") + (state_on_host ? "_host_state" : "") +
           (threshold == 1.0 ? "_100" : "");
  }
};
const Candidate kCandidates[] = {{MemoryPolicy::kNone},     {MemoryPolicy::kStatic},
                                 {MemoryPolicy::kFull},     {MemoryPolicy::kPerBlock},
                                 {MemoryPolicy::kPerBlock, false, 0.9, true},
                                 {MemoryPolicy::kDtr},      {MemoryPolicy::kDtr, false, 1.0},
                                 {MemoryPolicy::kHybrid},   {MemoryPolicy::kHybrid, true}};

struct Options {
  bool quick = false, keep_runs = false;
  int steps = 8, passes = 2;
  std::vector<double> ratios{0.8, 0.6};
  std::string configs = HT_SOURCE_DIR "/configs";
  std::string only;  // jobs whose name starts with this; empty: all
  Runner runner;
};

struct Job {
  std::string name;
  JobSpec spec;
};

double pct(double a, double b) { return 100.0 * (a - b) / b; }  // a against b

// auto's log line: `memory.policy = "auto" chose by the predicted step: none does not fit, static
// 123 ms, ...` as {policy name: predicted ms, or -1 where it does not fit}; `shares`: what
// per_block's cells say they keep ("per_block with offload keeping 50% 123 ms": 0.5).
std::map<std::string, double> predicted_steps(const std::string& output, std::map<std::string, double>& shares) {
  std::map<std::string, double> out;
  const std::string key = "chose by the predicted step: ";
  const size_t at = output.find(key);
  if (at == std::string::npos) return out;
  // The cells end where the line or its next clause ("; memory.block_keep chosen ...") does.
  const size_t end = std::min(output.find('\n', at), output.find(';', at));
  std::stringstream cells(output.substr(at + key.size(), end - at - key.size()));
  std::string cell;
  const std::string no_fit = " does not fit", ms = " ms";
  auto ends_with = [](const std::string& t, const std::string& end) {
    return t.size() >= end.size() && t.compare(t.size() - end.size(), end.size(), end) == 0;
  };
  while (std::getline(cells, cell, ',')) {
    cell = cell.substr(std::min(cell.size(), cell.find_first_not_of(' ')));
    if (ends_with(cell, no_fit)) {
      out[cell.substr(0, cell.size() - no_fit.size())] = -1.0;
    } else if (ends_with(cell, ms)) {  // "<name> <value> ms"
      const std::string head = cell.substr(0, cell.size() - ms.size());
      const size_t space = head.rfind(' ');
      // per_block's cells name the share it would keep ("per_block keeping 50%"): keyed without it.
      if (space != std::string::npos) {
        const std::string name = head.substr(0, space);
        const size_t keeping = name.find(" keeping ");
        out[name.substr(0, keeping)] = std::atof(head.c_str() + space + 1);
        if (keeping != std::string::npos) shares[name.substr(0, keeping)] = std::atof(name.c_str() + keeping + 9) / 100;
      }
    }
  }
  return out;
}

// The policy auto trained, from the run check's `predicted: ... step X ms (1 rank, micro-batch 64,
// fp32, dtr at 31.7 MiB)`: the plan's words name an evicting policy (auto itself, static plans
// once a sequence repeats, reads as static); none where they name none. "?" without the line.
std::string chosen_policy(const std::string& output) {
  const size_t at = output.find("predicted: peak ");
  if (at == std::string::npos) return "?";
  const size_t open = output.find(" ms (", at), close = output.find(')', open);
  if (open == std::string::npos || close == std::string::npos) return "?";
  std::stringstream words(output.substr(open + 5, close - open - 5));
  std::string word, policy = choice_name(MemoryPolicy::kNone);
  while (std::getline(words, word, ',')) {
    if (word.find_first_not_of(' ') == std::string::npos) continue;
    const std::string name = word.substr(word.find_first_not_of(' '), word.find(" at ") == std::string::npos
                                                                           ? std::string::npos
                                                                           : word.find(" at ") - 1);
    for (const Candidate& c : kCandidates) {
      if (name == choice_name(c.policy)) policy = name;
    }
    if (name == choice_name(MemoryPolicy::kDtr) + std::string(" evicting down to 100%")) return name;
    if (name == choice_name(MemoryPolicy::kAuto)) policy = choice_name(MemoryPolicy::kStatic);
    if (name == "optimizer state on host") return Candidate{MemoryPolicy::kHybrid, true}.name();
    if (name.rfind(choice_name(MemoryPolicy::kPerBlock), 0) == 0) policy = choice_name(MemoryPolicy::kPerBlock);
    if (name == "offloading to host") return Candidate{MemoryPolicy::kPerBlock, false, 0.9, true}.name();
  }
  return policy;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// One job at one budget: auto's run, then every candidate's, each `passes` times.
struct Outcome {
  bool failed = false;
  std::vector<std::string> failures, picks;
  bool picks_met = true;
};

Measurement run_passes(const Options& o, const Config& config, const Plan& plan, const std::string& name,
                      Outcome& outcome, std::string* output) {
  Measurement m;
  for (int pass = 0; pass < o.passes; ++pass) {
    const std::string run = name + (pass == 0 ? "" : "_" + std::to_string(pass + 1));
    std::fprintf(stderr, "[%s] run %d of %d\n", name.c_str(), pass + 1, o.passes);
    const Measurement one = measure(o.runner, config, plan, o.steps, run);
    if (output != nullptr && pass == 0) *output = read_text(o.runner.scratch + "/" + run + "/output.txt");
    m = pass == 0 ? one : merge_runs(m, one);
    if (!one.ok) break;
  }
  if (m.ok && m.peak_bytes > plan.budget_bytes) {
    outcome.failed = true;
    outcome.failures.push_back(name + ": peak " + std::to_string(m.peak_bytes) + " over the budget " +
                               std::to_string(plan.budget_bytes));
  }
  return m;
}

void run_budget(PlanCache& cache, const Options& o, const Job& job, double ratio, Outcome& outcome) {
  PlanArgs args;
  args.device_memory = kRoomy;
  args.policies = {MemoryPolicy::kNone};
  const Planned& planned = cache.get(job.spec, args);
  const Config& config = planned.config;
  const ModelProfile& profile = planned.plan.profile;
  const RunPlan run = run_plan_of(config);
  Plan plan{1, run.batch.micro, run.batch.micro_batches, config.training.mixed_precision, MemoryPolicy::kNone, kRoomy};
  const Prediction unbudgeted = predict(profile, planned.plan.machine, plan);
  const int64_t fixed = profile.parameter_bytes + profile.gradient_bytes + profile.optimizer_state_bytes;
  plan.budget_bytes = (fixed + static_cast<int64_t>(ratio * static_cast<double>(unbudgeted.peak_bytes - fixed))) / 64 * 64;
  char label[96];
  std::snprintf(label, sizeof label, "%s at %.2f", job.name.c_str(), ratio);
  std::printf("\n%s: budget %.1f MiB = fixed %.1f + %.2f x the predicted activations (unbudgeted peak %.1f MiB)\n",
              job.name.c_str(), plan.budget_bytes / kMiB, fixed / kMiB, ratio, unbudgeted.peak_bytes / kMiB);
  const std::string stem = job.name.substr(0, job.name.find(' ')) + "_" + std::to_string(static_cast<int>(ratio * 100));
  std::string output;
  plan.policy = MemoryPolicy::kAuto;
  const Measurement chosen = run_passes(o, config, plan, stem + "_auto", outcome, &output);
  std::map<std::string, double> shares;
  const std::map<std::string, double> predicted = predicted_steps(output, shares);
  const std::string pick = chosen_policy(output);
  std::printf("| %-39s | %12s | %11s | %8s | %10s | %s\n", "policy", "predicted ms", "measured ms", "error", "peak MiB",
              "");
  std::printf("|%s|\n", std::string(100, '-').c_str());
  double best = INFINITY;
  std::string best_name;
  for (const Candidate& candidate : kCandidates) {
    plan.policy = candidate.policy;
    plan.state_on_host = candidate.state_on_host;
    plan.block_offload = candidate.offload;
    // per_block at the share auto would train it at (0 where auto's line has none: the run's own
    // check picks it without offload; with offload it keeps nothing on the device).
    plan.block_keep_share = shares.count(candidate.name()) ? shares.at(candidate.name()) : 0;
    plan.eviction_threshold = candidate.threshold;
    const std::string name = candidate.name();
    const Measurement m = run_passes(o, config, plan, stem + "_" + candidate.stem(), outcome, nullptr);
    const auto p = predicted.find(name);
    char pred[32] = "-", error[32] = "";
    if (p != predicted.end()) std::snprintf(pred, sizeof pred, "%.1f", p->second);
    if (p != predicted.end() && p->second < 0) std::snprintf(pred, sizeof pred, "does not fit");
    if (m.ok && p != predicted.end() && p->second > 0) std::snprintf(error, sizeof error, "%+.1f%%", pct(p->second, m.quiet_ms));
    if (m.ok && m.quiet_ms < best) best = m.quiet_ms, best_name = name;
    char measured[32] = "failed", peak[32] = "";
    if (m.ok) {
      std::snprintf(measured, sizeof measured, "%.1f", m.quiet_ms);
      std::snprintf(peak, sizeof peak, "%.1f", m.peak_bytes / kMiB);
    }
    std::printf("| %-39s | %12s | %11s | %8s | %10s | %s\n", name.c_str(), pred, measured, error, peak,
                name == pick ? "<- auto's pick" : (m.ok ? "" : m.error.substr(0, 100).c_str()));
  }
  char text[192];
  if (!chosen.ok && best_name.empty()) {
    // A refusal where no candidate trains either is auto right.
    std::snprintf(text, sizeof text, "refused, and no candidate trains in this budget either");
  } else if (!chosen.ok) {
    outcome.failed = true;
    outcome.failures.push_back(std::string(label) + ": auto's run failed where " + best_name + " trains: " + chosen.error);
    std::snprintf(text, sizeof text, "auto's run FAILED where %s trains", best_name.c_str());
  } else {
    const bool within = chosen.quiet_ms <= 1.05 * best;
    outcome.picks_met &= within;
    std::snprintf(text, sizeof text, "%s (auto %s: %.1f ms; fastest measured %s: %.1f ms, %+.1f%%)", within ? "yes" : "NO",
                  pick.c_str(), chosen.quiet_ms, best_name.c_str(), best, pct(chosen.quiet_ms, best));
  }
  std::printf("  auto's run within 5%% of the fastest candidate measured: %s\n", text);
  outcome.picks.push_back(std::string(label) + ": " + text);
}

}  // namespace
}  // namespace ht::bench

int main(int argc, char** argv) {
  ht::restart_with_passive_openmp(argv);  // as hybrid_train: profiles here must time what its runs time
  CLI::App app{"memory.policy = \"auto\" (a budget alone) against every policy it chooses from, measured in the same budget"};
  ht::bench::Options o;
  o.runner.binary = ht::bench::default_binary();
  app.add_flag("--quick", o.quick, "one job, one budget, one pass of a few steps, for a smoke run");
  app.add_option("--binary", o.runner.binary, "the hybrid_train to measure with")->capture_default_str();
  app.add_option("--steps", o.steps, "training steps a run takes")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--passes", o.passes, "runs of each policy, one after the other")->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--ratios", o.ratios, "budgets: fixed state + this share of the predicted activations")
      ->delimiter(',')->capture_default_str();
  app.add_flag("--keep-runs", o.keep_runs, "keep every run's config, output and metrics");
  app.add_option("--only", o.only, "only the jobs whose name starts with this (ConvNet, GPT-small, GPT-6L, ResNet, Llama, Llama-6L)");
  app.add_option("--configs", o.configs, "the folder of the example configs")->capture_default_str();
  int threads = 1;
  app.add_option("--threads", threads, "training.threads for every job")->check(CLI::PositiveNumber)->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (access(o.runner.binary.c_str(), X_OK) != 0) {
    std::fprintf(stderr, "bench_auto_policy: --binary %s: no such program; build hybrid_train first\n",
                 o.runner.binary.c_str());
    return 2;
  }
  const std::string t = "training.threads=" + std::to_string(threads);
  std::vector<ht::bench::Job> jobs{
      {"ConvNet (quickstart.toml)", {o.configs + "/quickstart.toml", {t}}},
      {"GPT-small (gpt_tiny.toml)", {o.configs + "/gpt_tiny.toml", {t}}},
      // bench_dtr_budget's GPT row's shape (6 layers of 256, 128 tokens, 8 sequences), on text.
      {"GPT-6L (gpt_tiny.toml at 6 x 256, T128 b8)",
       {o.configs + "/gpt_tiny.toml", {t, "model.n_layer=6", "model.n_head=8", "model.n_embd=256", "model.block_size=128",
                                       "training.global_batch_size=8"}}},
      {"ResNet-18 (resnet18_fmnist.toml, b32)", {o.configs + "/resnet18_fmnist.toml", {t, "training.global_batch_size=32"}}},
      {"Llama (llama_debug.toml)", {o.configs + "/llama_debug.toml", {t}}},
      // bench_dtr_budget's Llama row's shape (llama_small.toml's layers, 128 tokens, 8 sequences,
      // 4,096 words: its output layer in chunks), on synthetic tokens.
      {"Llama-6L (llama_debug.toml at 6 x 256, T128 b8, 4096 words)",
       {o.configs + "/llama_debug.toml",
        {t, "model.n_layer=6", "model.n_head=8", "model.n_kv_heads=4", "model.n_embd=256", "model.multiple_of=64",
         "model.block_size=128", "model.vocab_size=4096", "data.dataset=synthetic", "data.synthetic_classes=4096",
         "data.synthetic_samples=512", "training.global_batch_size=8"}}}};
  if (!o.only.empty()) {
    jobs.erase(std::remove_if(jobs.begin(), jobs.end(),
                              [&](const ht::bench::Job& j) { return j.name.rfind(o.only, 0) != 0; }),
               jobs.end());
  }
  if (o.quick) {
    jobs.resize(std::min<size_t>(jobs.size(), 1));
    o.ratios = {0.9};
    o.steps = std::min(o.steps, 3);
    o.passes = 1;
  }
  ht::CpuAllocationCounter::install();
  char scratch[] = "/tmp/bench_auto_policy.XXXXXX";
  if (mkdtemp(scratch) == nullptr) {
    std::perror("bench_auto_policy: mkdtemp");
    return 1;
  }
  o.runner.scratch = scratch;
  std::printf("bench_auto_policy: %s, %d steps a run, %d runs a policy, runs in %s\n", o.runner.binary.c_str(),
              o.steps, o.passes, scratch);
  ht::bench::PlanCache cache;
  ht::bench::Outcome outcome;
  try {
    for (const auto& job : jobs) {
      for (double ratio : o.ratios) ht::bench::run_budget(cache, o, job, ratio, outcome);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_auto_policy: %s\n", e.what());
    return 1;
  }
  std::printf("\nsummary: auto's run within 5%% of the fastest candidate measured: %s\n",
              outcome.picks_met ? "met" : "MISSED");
  for (const std::string& p : outcome.picks) std::printf("  %s\n", p.c_str());
  if (outcome.failed) std::printf("FAILED:\n");
  for (const std::string& f : outcome.failures) std::printf("  %s\n", f.c_str());
  if (!outcome.failed && !o.keep_runs) ht::remove_tree(scratch);
  return outcome.failed ? 1 : 0;
}

// The planner against measurement. Each row is one plan of one job (the ConvNet, ResNet-18, GPT
// at two sizes, the SPOS supernet; micro-batches with accumulation, bf16, DTR budgets, 1, 2 and 4
// ranks), predicted in this process from the job's profile exactly as `hybrid_train plan` would
// (plan_job), then trained by hybrid_train (under mpirun for several ranks) and read back from its
// metrics.jsonl: peak memory (the arena's, the highest of any step on the fullest rank) and step time, with the error
// of each. This machine's speed drifts by 10-30% over seconds, so every row is trained twice, a
// minute apart, and the step time compared is the 25th percentile of both runs' steps after two
// warm-up steps (the profile times its fastest step: both stand for the machine unloaded); the
// two runs' own difference is printed beside it, the noise floor no model can beat. Then scenarios, a job with a device memory and
// a rank cap: the planner searches, and its pick and the best plans that differ from it in ranks,
// micro-batch, memory policy or precision are all trained; the pick should be within 5% of the
// fastest of them. A failed run, or a measured peak over its plan's budget, is an error (exit 1);
// a missed accuracy target is reported, not an error: timings on a shared machine vary.
#include "base/remove_tree.h"
#include "bench/bench_util.h"
#include "bench/planner_rows.h"
#include "alloc/cpu_device_allocator.h"
#include "runtime/thread_pools.h"

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <unistd.h>

#ifndef HT_MPIEXEC
#define HT_MPIEXEC ""
#endif

namespace ht::bench {
namespace {

constexpr double kMiB = 1 << 20;
// Rows without a budget of their own train in an arena this large: the measured peak is then the
// arena's, as in every plan the planner writes, with room to spare.
constexpr int64_t kRoomy = int64_t{1} << 30;

struct RowSpec {
  std::string model;
  JobSpec job;
  int ranks = 1;
  int64_t micro = 0, accumulation = 1;
  MixedPrecision precision = MixedPrecision::kOff;
  double dtr_share = 0;  // > 0: dtr in a budget of this share of the plan's peak without eviction
  int steps = 0;         // 0: --steps
  bool varies = false;   // each step samples different work (the supernet): compared by the median
  // >= 0: memory.policy = "per_block" keeping this share of each block (with offload: 0 is
  // everything to host or regenerated), in a budget of budget_share of the plan's peak without
  // eviction, raised by 5% until the planner thinks it works.
  double block_keep = -1;
  bool offload = false;
  double budget_share = 0;
};

RowSpec per_block_row(const char* model, const JobSpec& job, int64_t micro, double keep, bool offload,
                      double budget_share) {
  RowSpec r{model, job, 1, micro, 1};
  r.block_keep = keep;
  r.offload = offload;
  r.budget_share = budget_share;
  return r;
}

struct Row {
  int number = 0;  // in row_specs' list, from 1 (--rows)
  RowSpec spec;
  const Planned* planned = nullptr;
  Plan plan;
  Prediction predicted;
  Prediction traced;     // the same plan from traces alone (no profile): its peak
  Measurement measured;  // both runs: quiet_ms over both runs' steps
  double run_to_run_pct = NAN;  // |quiet_ms(first) - quiet_ms(second)| / quiet_ms of both
};

struct ScenarioSpec {
  std::string name;
  JobSpec job;
  int64_t device_memory = 0;
  std::vector<int> ranks;
  int steps = 0;
};

struct Options {
  bool quick = false;
  std::vector<int> rows;  // --rows: these rows only (and no scenarios); empty: all
  bool keep_runs = false;
  int steps = 10;
  bool profiles = false;
  std::string configs = HT_SOURCE_DIR "/configs";
  Runner runner;
};

// What the run found wrong (exit 1) and what the summary reports.
struct Outcome {
  bool failed = false;
  std::vector<std::string> failures;  // "row4: why"
  std::vector<std::string> picks;  // per scenario: "name: yes (+1.2%)"
  bool picks_met = true;
  double slowest_search_s = 0;
  std::vector<double> probe_ms;  // the fixed kernel's times, one before each run
};

// The machine's own steadiness: one fixed piece of work (twenty 512 x 512 fp32 matmuls, about
// 30 ms here), timed before each run. Its spread is what no prediction of a step can beat.
void probe_machine(Outcome& outcome) {
  static const at::Tensor a = at::rand({512, 512});
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) (void)at::mm(a, a);
  outcome.probe_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
}

struct Jobs {
  std::string dir;
  std::vector<std::string> extra;  // overrides every job takes (--threads)
  JobSpec at(const char* file, std::vector<std::string> overrides = {}) const {
    overrides.insert(overrides.end(), extra.begin(), extra.end());
    return {dir + "/" + file, std::move(overrides)};
  }
  JobSpec convnet() const { return at("quickstart.toml"); }
  JobSpec resnet(int batch) const {
    return at("resnet18_fmnist.toml", {"training.global_batch_size=" + std::to_string(batch)});
  }
  JobSpec gpt_small() const { return at("gpt_tiny.toml"); }
  JobSpec gpt_large() const { return at("gpt_tiny.toml", {"model.n_layer=4", "model.n_embd=128"}); }
  JobSpec supernet() const { return at("spos_synthetic.toml"); }
};

std::vector<RowSpec> row_specs(const Jobs& j, bool quick) {
  if (quick) return {{"ConvNet", j.convnet(), 1, 16, 4}, {"ConvNet", j.convnet(), 2, 32, 1}};
  // ResNet-18 steps take the better part of a second here: fewer of them.
  return {{"ConvNet", j.convnet(), 1, 64, 1},
          {"ConvNet", j.convnet(), 1, 16, 4},
          {"ConvNet", j.convnet(), 1, 64, 1, MixedPrecision::kBf16},
          {"ConvNet", j.convnet(), 1, 64, 1, MixedPrecision::kOff, 0.65},
          {"ConvNet", j.convnet(), 2, 32, 1},
          {"ResNet-18", j.resnet(32), 1, 32, 1, MixedPrecision::kOff, 0, 8},
          {"ResNet-18", j.resnet(32), 1, 32, 1, MixedPrecision::kBf16, 0.65, 8},
          {"ResNet-18", j.resnet(32), 2, 16, 1, MixedPrecision::kOff, 0, 8},
          {"GPT-small", j.gpt_small(), 1, 32, 1},
          {"GPT-small", j.gpt_small(), 1, 8, 4, MixedPrecision::kBf16},
          {"GPT-small", j.gpt_small(), 4, 8, 1},
          {"GPT-large", j.gpt_large(), 1, 32, 1},
          {"GPT-large", j.gpt_large(), 1, 32, 1, MixedPrecision::kOff, 0.65},
          {"GPT-large", j.gpt_large(), 2, 8, 2, MixedPrecision::kBf16},
          {"supernet", j.supernet(), 1, 64, 1, MixedPrecision::kOff, 0, 0, true},
          {"supernet", j.supernet(), 4, 16, 1, MixedPrecision::kOff, 0, 0, true},
          per_block_row("GPT-large", j.gpt_large(), 32, 0.5, false, 0.85),
          per_block_row("GPT-large", j.gpt_large(), 32, 0.0, true, 0.7)};
}

std::vector<ScenarioSpec> scenario_specs(const Jobs& j, bool quick) {
  const int64_t mib = int64_t{1} << 20;
  if (quick) return {{"ConvNet", j.convnet(), 24 * mib, {1}, 3}};
  return {{"ResNet-18, batch 64", j.resnet(64), 256 * mib, {1, 2}, 6},
          {"ConvNet", j.convnet(), 24 * mib, {1}},
          {"GPT-large", j.gpt_large(), 40 * mib, {1, 2}}};
}

// The planning arguments of a row's job: every rank count and precision its rows use, so that the
// profile is the one `hybrid_train plan --ranks ... --precisions ...` would take.
PlanArgs row_args(const std::vector<RowSpec>& specs, const RowSpec& row) {
  PlanArgs a;
  a.device_memory = kRoomy;
  a.policies = {MemoryPolicy::kNone};  // a row's plan is given, not searched for
  for (const RowSpec& s : specs) {
    if (s.job.config != row.job.config || s.job.overrides != row.job.overrides) continue;
    if (std::find(a.ranks.begin(), a.ranks.end(), s.ranks) == a.ranks.end()) a.ranks.push_back(s.ranks);
    if (std::find(a.precisions.begin(), a.precisions.end(), s.precision) == a.precisions.end()) {
      a.precisions.push_back(s.precision);
    }
  }
  std::sort(a.ranks.begin(), a.ranks.end());
  // The first precision sets the profiler's smaller point; the configs' own is fp32.
  std::stable_partition(a.precisions.begin(), a.precisions.end(), [](MixedPrecision p) { return p == MixedPrecision::kOff; });
  return a;
}

Row plan_row(PlanCache& cache, const std::vector<RowSpec>& specs, const RowSpec& s) {
  Row row;
  row.spec = s;
  row.planned = &cache.get(s.job, row_args(specs, s));
  const ModelProfile& profile = row.planned->plan.profile;
  const Machine& machine = row.planned->plan.machine;
  row.plan = Plan{s.ranks, s.micro, s.accumulation, s.precision, MemoryPolicy::kNone, machine.device_memory};
  row.predicted = predict(profile, machine, row.plan);
  // DTR at the smallest share of the peak without eviction, from dtr_share up, that the planner
  // thinks works: where the model's own state is most of the peak (ResNet-18), 65% cannot.
  const auto unconstrained = static_cast<double>(row.predicted.peak_bytes);
  for (double share = s.dtr_share; share > 0 && share < 0.99; share += 0.05) {
    row.plan.policy = MemoryPolicy::kDtr;
    row.plan.budget_bytes = std::llround(unconstrained * share);
    row.predicted = predict(profile, machine, row.plan);
    if (row.predicted.fits) break;
  }
  for (double share = s.budget_share; s.block_keep >= 0 && share < 0.99; share += 0.05) {
    row.plan.policy = MemoryPolicy::kPerBlock;
    row.plan.block_keep_share = s.block_keep;
    row.plan.block_offload = s.offload;
    row.plan.budget_bytes = std::llround(unconstrained * share);
    row.predicted = predict(profile, machine, row.plan);
    if (row.predicted.fits) break;
  }
  std::vector<int64_t> micros;  // every micro-batch size of the job's rows, each traced
  for (const RowSpec& o : specs) {
    if (o.job.config == s.job.config && o.job.overrides == s.job.overrides) micros.push_back(o.micro);
  }
  std::sort(micros.begin(), micros.end());
  micros.erase(std::unique(micros.begin(), micros.end()), micros.end());
  row.traced = predict(cache.traced(*row.planned, row_args(specs, s).precisions, micros), machine, row.plan);
  return row;
}

// The measured step a row's prediction is held to: the machine unloaded (the 25th percentile), or
// for work that varies by step, its median (the profile times it so too).
double compared_ms(const RowSpec& spec, const Measurement& m) { return spec.varies ? m.step_ms : m.quiet_ms; }

double error_pct(double predicted, double measured) { return 100.0 * (predicted - measured) / measured; }

std::string short_plan(const Plan& p) {
  char text[128];
  std::string policy = choice_name(p.policy);
  if (p.policy == MemoryPolicy::kPerBlock) {
    policy += " " + std::to_string(std::lround(100 * p.block_keep_share)) + "%" + (p.block_offload ? " off" : "");
  }
  std::snprintf(text, sizeof text, "%d%s %3lld x %-2lld  %-4s  %s%s", p.devices(),
                p.stages > 1 ? ("(" + std::to_string(p.stages) + "st)").c_str() : "", static_cast<long long>(p.micro_batch),
                static_cast<long long>(p.accumulation), p.precision == MixedPrecision::kOff ? "fp32" : choice_name(p.precision),
                !evicts(p.policy) ? "none" : (policy + " @ " + std::to_string(std::lround(p.budget_bytes / kMiB)) +
                                               " MiB").c_str(),
                p.ranks > 1 && p.shard != ShardLevel::kNone
                    ? (" zero" + std::to_string(static_cast<int>(p.shard))).c_str()
                    : "");
  return text;
}

// Trains `plan`, says so on stderr, and records a failure: a run that failed, or a peak over budget.
Measurement measure_plan(const Options& o, const Config& config, const Plan& plan, int steps, const std::string& name,
                         Outcome& outcome) {
  probe_machine(outcome);
  Measurement m = measure(o.runner, config, plan, steps, name);
  if (!m.ok) {
    std::fprintf(stderr, "  %s FAILED: %s\n", name.c_str(), m.error.c_str());
    outcome.failed = true;
    outcome.failures.push_back(name + " (" + short_plan(plan) + "): " + m.error);
  } else if (plan.budget_bytes > 0 && m.peak_bytes > plan.budget_bytes) {
    char why[128];
    std::snprintf(why, sizeof why, "measured peak %.2f MiB over the plan's budget %.2f MiB", m.peak_bytes / kMiB,
                  plan.budget_bytes / kMiB);
    std::fprintf(stderr, "  %s: %s\n", name.c_str(), why);
    outcome.failed = true;
    outcome.failures.push_back(name + " (" + short_plan(plan) + "): " + why);
  }
  std::fprintf(stderr, "  %s: %s; %.1f s, step %.1f ms (25th percentile %.1f), peak %.1f MiB, other load %.2f cores\n", name.c_str(),
               short_plan(plan).c_str(), m.wall_s, m.step_ms, m.quiet_ms, m.peak_bytes / kMiB, m.other_load);
  return m;
}

// "predicted | measured | error" cells; a failed run's measured cells say so.
std::string versus(double predicted, double measured, bool ok, int digits) {
  char text[64];
  if (ok) {
    std::snprintf(text, sizeof text, "%9.*f | %9.*f | %+7.1f", digits, predicted, digits, measured,
                  error_pct(predicted, measured));
  } else {
    std::snprintf(text, sizeof text, "%9.*f | %9s | %7s", digits, predicted, "failed", "-");
  }
  return text;
}

void print_rows(const std::vector<Row>& rows) {
  std::printf("\nerror = (predicted - measured) / measured; peak: the highest step's; step: the 25th percentile "
              "of two runs' steps after 2 warm-up steps each (\"median\": theirs; \"run/run\": how far the two "
              "runs' own 25th percentiles differ)\n");
  std::printf("\n| %2s | %-9s | %-30s | %9s | %9s | %7s | %7s | %9s | %9s | %7s | %9s | %7s |\n", "#", "model",
              "ranks micro x acc prec policy", "peak pred", "meas MiB", "err %", "trace %", "step pred", "meas ms",
              "err %", "median", "run/run");
  std::printf("|%s|\n", std::string(154, '-').c_str());
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const Measurement& m = r.measured;
    std::printf("| %2d | %-9s | %-30s | %s | %+7.1f | %s | %9.1f | %6.1f%% |\n", r.number, r.spec.model.c_str(),
                short_plan(r.plan).c_str(), versus(r.predicted.peak_bytes / kMiB, m.peak_bytes / kMiB, m.ok, 2).c_str(),
                m.ok ? error_pct(r.traced.peak_bytes, m.peak_bytes) : NAN,
                versus(r.predicted.step_ms, compared_ms(r.spec, m), m.ok, 1).c_str(), m.step_ms, r.run_to_run_pct);
  }
}

// The step's terms side by side: which one a wrong prediction comes from.
void print_terms(const std::vector<Row>& rows) {
  std::printf("\nstep terms, ms (measured recompute and all-reduce from the run's metrics; \"rest\" is its step "
              "less both, against predicted compute + optimizer; \"other\": cores busy with other processes or "
              "stolen during the run):\n\n");
  std::printf("| %2s | %9s | %9s | %9s | %9s | %9s | %9s | %9s | %9s | %9s | %15s | %13s | %5s |\n", "#", "compute",
              "optimizer", "rest pred", "rest meas", "recomp p", "recomp m", "allred p", "allred m", "evict p/m",
              "peak 1st/later", "steps min-max", "other");
  std::printf("|%s|\n", std::string(155, '-').c_str());
  for (size_t i = 0; i < rows.size(); ++i) {
    const Prediction& p = rows[i].predicted;
    const Measurement& m = rows[i].measured;
    char measured[96];  // evictions, first and later peaks, fastest and slowest step, other load
    std::snprintf(measured, sizeof measured, "%4lld/%-4.0f | %7.2f/%-7.2f | %6.0f-%-6.0f | %5.2f",
                  static_cast<long long>(p.evictions), m.evictions, m.first_peak_bytes / kMiB,
                  m.later_peak_bytes / kMiB, m.fastest_ms, m.slowest_ms, m.other_load);
    std::printf("| %2d | %9.1f | %9.1f | %9.1f | %9.1f | %9.1f | %9.1f | %9.1f | %9.1f | %s |\n", rows[i].number, p.compute_ms,
                p.optimizer_ms, p.compute_ms + p.optimizer_ms, compared_ms(rows[i].spec, m) - m.recompute_ms - m.comm_ms, p.recompute_ms,
                m.recompute_ms, p.allreduce_exposed_ms, m.comm_ms, measured);
  }
}

std::vector<Row> run_rows(PlanCache& cache, const Options& o, const Jobs& jobs, Outcome& outcome) {
  std::vector<RowSpec> specs = row_specs(jobs, o.quick);
  if (o.runner.mpirun.empty()) {
    const auto n = std::count_if(specs.begin(), specs.end(), [](const RowSpec& s) { return s.ranks > 1; });
    if (n > 0) std::printf("no mpirun (none found at build time, or --mpirun empty): %ld rows of several ranks "
                           "skipped\n", n);
    specs.erase(std::remove_if(specs.begin(), specs.end(), [](const RowSpec& s) { return s.ranks > 1; }), specs.end());
  }
  std::vector<Row> rows;
  for (size_t i = 0; i < specs.size(); ++i) {  // every profile first, alone
    const int number = static_cast<int>(i) + 1;
    if (!o.rows.empty() && std::find(o.rows.begin(), o.rows.end(), number) == o.rows.end()) continue;
    rows.push_back(plan_row(cache, specs, specs[i]));
    rows.back().number = number;
  }
  // Every row twice, the second pass after the first: the machine's drift between a row's runs.
  std::vector<Measurement> first;
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < rows.size(); ++i) {
      Row& r = rows[i];
      std::fprintf(stderr, "[row %zu/%zu, run %d of 2] %s\n", i + 1, rows.size(), pass + 1, r.spec.model.c_str());
      Measurement m = measure_plan(o, r.planned->config, r.plan, r.spec.steps > 0 ? r.spec.steps : o.steps,
                                   "row" + std::to_string(r.number) + (pass == 0 ? "" : "b"), outcome);
      if (pass == 0) {
        first.push_back(std::move(m));
        continue;
      }
      r.measured = merge_runs(first[i], m);
      if (r.measured.ok) {
        r.run_to_run_pct = 100.0 * std::abs(compared_ms(r.spec, first[i]) - compared_ms(r.spec, m)) /
                           compared_ms(r.spec, r.measured);
      }
    }
  }
  print_rows(rows);
  print_terms(rows);
  return rows;
}

// The pick (ranked[0]), the runner-up, and the best fitting plan not chosen yet that differs from
// the pick in each way a plan can: ranks, micro-batch, memory policy, precision. At most `most`
// besides the pick.
std::vector<size_t> plans_to_measure(const std::vector<RankedPlan>& ranked, size_t most) {
  using Differs = bool (*)(const Plan&, const Plan&);
  const Differs ways[] = {
      [](const Plan&, const Plan&) { return true; },
      [](const Plan& a, const Plan& b) { return a.ranks != b.ranks; },
      [](const Plan& a, const Plan& b) { return a.micro_batch != b.micro_batch; },
      [](const Plan& a, const Plan& b) { return a.policy != b.policy; },
      [](const Plan& a, const Plan& b) { return a.precision != b.precision; }};
  std::vector<size_t> out{0};
  for (Differs differs : ways) {
    for (size_t i = 1; i < ranked.size() && ranked[i].prediction.fits && out.size() <= most; ++i) {
      if (!differs(ranked[i].plan, ranked[0].plan) || std::find(out.begin(), out.end(), i) != out.end()) continue;
      out.push_back(i);
      break;
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

void print_scenario(const std::vector<RankedPlan>& ranked, const std::vector<size_t>& chosen,
                    const std::vector<Measurement>& ms) {
  std::printf("| %6s | %-30s | %9s | %9s | %7s | %9s | %9s | %7s |\n", "rank", "ranks micro x acc prec policy",
              "peak pred", "meas MiB", "err %", "step pred", "meas ms", "err %");
  std::printf("|%s|\n", std::string(107, '-').c_str());
  for (size_t k = 0; k < chosen.size(); ++k) {
    const RankedPlan& r = ranked[chosen[k]];
    const Measurement& m = ms[k];
    std::printf("| %6zu | %-30s | %s | %s |\n", chosen[k] + 1, short_plan(r.plan).c_str(),
                versus(r.prediction.peak_bytes / kMiB, m.peak_bytes / kMiB, m.ok, 2).c_str(),
                versus(r.prediction.step_ms, m.quiet_ms, m.ok, 1).c_str());
  }
}

void run_scenario(PlanCache& cache, const Options& o, const ScenarioSpec& s, Outcome& outcome) {
  PlanArgs args;
  args.ranks = s.ranks;
  args.device_memory = s.device_memory;
  if (o.runner.mpirun.empty()) args.ranks = {1};
  const Planned& p = cache.get(s.job, args);
  const std::vector<RankedPlan>& ranked = p.plan.ranked;
  std::string ranks;
  for (int r : args.ranks) ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
  std::printf("\nscenario %s, global batch %lld, %.0f MiB per rank, ranks {%s}: %zu plans, search %.1f s "
              "(profile %.1f s); each plan run twice, steps as the rows'\n", s.name.c_str(), static_cast<long long>(p.config.training.global_batch_size),
              s.device_memory / kMiB, ranks.c_str(), ranked.size(), p.seconds, p.plan.profile.seconds);
  outcome.slowest_search_s = std::max(outcome.slowest_search_s, p.seconds);
  if (ranked.empty() || !ranked[0].prediction.fits) {
    std::printf("  no plan fits: nothing to measure\n");
    outcome.picks.push_back(s.name + ": no plan fits");
    return;
  }
  const std::vector<size_t> chosen = plans_to_measure(ranked, 3);
  // Each plan twice, in two passes, as the rows: the pick is judged on both runs' steps.
  std::vector<Measurement> ms;
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t k = 0; k < chosen.size(); ++k) {
      const size_t i = chosen[k];
      std::fprintf(stderr, "[scenario %s] plan #%zu, run %d of 2\n", s.name.c_str(), i + 1, pass + 1);
      Measurement m = measure_plan(o, p.config, ranked[i].plan, s.steps > 0 ? s.steps : o.steps,
                                   "scenario" + std::to_string(outcome.picks.size() + 1) + "_plan" +
                                       std::to_string(i + 1) + (pass == 0 ? "" : "b"),
                                   outcome);
      if (pass == 0) ms.push_back(std::move(m));
      else ms[k] = merge_runs(ms[k], m);
    }
  }
  print_scenario(ranked, chosen, ms);
  double best = INFINITY;
  for (const Measurement& m : ms) {
    if (m.ok) best = std::min(best, m.quiet_ms);
  }
  const bool within = ms[0].ok && ms[0].quiet_ms <= 1.05 * best;
  char text[128];
  std::snprintf(text, sizeof text, "%s (pick %.1f ms, best measured %.1f ms, %+.1f%%)", within ? "yes" : "NO",
                ms[0].quiet_ms, best, error_pct(ms[0].quiet_ms, best));
  std::printf("  the pick within 5%% of the best measured: %s\n", text);
  outcome.picks.push_back(s.name + ": " + text);
  outcome.picks_met &= within;
}

void print_summary(const std::vector<Row>& rows, const Outcome& outcome) {
  std::vector<double> peak, traced, step, noise;
  for (const Row& r : rows) {
    if (!r.measured.ok) continue;
    peak.push_back(std::abs(error_pct(r.predicted.peak_bytes, r.measured.peak_bytes)));
    traced.push_back(std::abs(error_pct(r.traced.peak_bytes, r.measured.peak_bytes)));
    step.push_back(std::abs(error_pct(r.predicted.step_ms, compared_ms(r.spec, r.measured))));
    noise.push_back(r.run_to_run_pct);
  }
  auto most = [](const std::vector<double>& v) { return v.empty() ? NAN : *std::max_element(v.begin(), v.end()); };
  auto mid = [](const std::vector<double>& v) { return v.empty() ? NAN : median(v); };
  auto verdict = [](bool met) { return met ? "met" : "MISSED"; };
  std::printf("\nsummary over %zu measured rows:\n", peak.size());
  std::printf("  peak |error|: max %.1f%%, median %.1f%%; target every row within 5%%: %s\n", most(peak), mid(peak),
              verdict(most(peak) <= 5));
  std::printf("  peak |error| from traces alone (no profile; \"trace %%\"): max %.1f%%, median %.1f%%; every row within "
              "5%%: %s\n", most(traced), mid(traced), verdict(most(traced) <= 5));
  std::printf("  step |error|: max %.1f%%, median %.1f%%; target every row within 10%%: %s; median within 5%%: %s\n",
              most(step), mid(step), verdict(most(step) <= 10), verdict(mid(step) <= 5));
  std::printf("  the same plan run twice (the noise floor): max %.1f%%, median %.1f%% apart\n", most(noise), mid(noise));
  if (!outcome.probe_ms.empty()) {
    std::vector<double> t = outcome.probe_ms;
    std::sort(t.begin(), t.end());
    auto at = [&](double q) { return t[static_cast<size_t>(q * static_cast<double>(t.size() - 1))]; };
    std::printf("  the machine itself, one fixed matmul loop timed before each of %zu runs: min %.1f, 25th %.1f, "
                "median %.1f, 75th %.1f, max %.1f ms (75th/25th %.2f)\n",
                t.size(), t.front(), at(0.25), at(0.5), at(0.75), t.back(), at(0.75) / at(0.25));
  }
  std::printf("  the pick within 5%% of the best measured plan: %s\n", verdict(outcome.picks_met));
  for (const std::string& p : outcome.picks) std::printf("    %s\n", p.c_str());
  std::printf("  search (profile + search) under 10 s per config: %s (slowest %.1f s)\n",
              verdict(outcome.slowest_search_s < 10), outcome.slowest_search_s);
  if (outcome.failed) std::printf("FAILED: a run failed, or its peak exceeded its budget:\n");
  for (const std::string& f : outcome.failures) std::printf("  %s\n", f.c_str());
}

}  // namespace
}  // namespace ht::bench

int main(int argc, char** argv) {
  ht::restart_with_passive_openmp(argv);  // as hybrid_train: profiles here must time what its runs time
  CLI::App app{"The planner's accuracy: predicted against measured peak memory and step time, plan by plan, and "
               "whether its pick is the fastest measured"};
  ht::bench::Options o;
  o.runner.binary = ht::bench::default_binary();
  o.runner.mpirun = HT_MPIEXEC;
  app.add_flag("--quick", o.quick, "2 rows and 1 scenario of a few steps, for a smoke run");
  app.add_option("--rows", o.rows, "only these rows (numbers as the full table has them), and no scenario")
      ->delimiter(',')->check(CLI::PositiveNumber);
  app.add_option("--binary", o.runner.binary, "the hybrid_train to measure with")->capture_default_str();
  app.add_option("--mpirun", o.runner.mpirun, "mpirun for runs of several ranks; empty: skip them")
      ->capture_default_str();
  app.add_option("--steps", o.steps, "training steps a measured run takes (slow rows take fewer)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_flag("--profiles", o.profiles, "print each job's profile, as `hybrid_train plan` does");
  app.add_flag("--keep-runs", o.keep_runs, "keep every run's config, output and metrics (a failed run's are kept)");
  app.add_option("--configs", o.configs, "the folder of the example configs")->capture_default_str();
  int threads = 0;
  app.add_option("--threads", threads,
                 "training.threads for every job (1: steps free of a shared VM's second core; the planner then "
                 "takes the host for one thread, so rows of several ranks are predicted oversubscribed)")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  if (o.quick) o.steps = std::min(o.steps, 3);
  if (access(o.runner.binary.c_str(), X_OK) != 0) {
    std::fprintf(stderr, "bench_planner_accuracy: --binary %s: no such program; build hybrid_train first\n",
                 o.runner.binary.c_str());
    return 2;
  }
  if (!o.runner.mpirun.empty() && access(o.runner.mpirun.c_str(), X_OK) != 0) o.runner.mpirun.clear();
  ht::CpuAllocationCounter::install();
  char scratch[] = "/tmp/bench_planner_accuracy.XXXXXX";
  if (mkdtemp(scratch) == nullptr) {
    std::perror("bench_planner_accuracy: mkdtemp");
    return 1;
  }
  o.runner.scratch = scratch;
  std::printf("bench_planner_accuracy: %s, runs in %s, mpirun %s\n", o.runner.binary.c_str(), scratch,
              o.runner.mpirun.empty() ? "none" : o.runner.mpirun.c_str());
  const auto start = std::chrono::steady_clock::now();
  ht::bench::PlanCache cache(o.profiles);
  ht::bench::Outcome outcome;
  ht::bench::Jobs jobs{o.configs, {}};
  if (threads > 0) jobs.extra.push_back("training.threads=" + std::to_string(threads));
  try {
    const auto rows = ht::bench::run_rows(cache, o, jobs, outcome);
    if (o.rows.empty()) {
      for (const auto& s : ht::bench::scenario_specs(jobs, o.quick)) ht::bench::run_scenario(cache, o, s, outcome);
    }
    ht::bench::print_summary(rows, outcome);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_planner_accuracy: %s\n", e.what());
    return 1;
  }
  std::printf("wall time %.0f s\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  // A failed run's output stays for reading.
  if (!outcome.failed && !o.keep_runs) ht::remove_tree(scratch);
  return outcome.failed ? 1 : 0;
}

#include "bench/planner_rows.h"

#include "bench/bench_util.h"
#include "launcher/config/config_loader.h"
#include "launcher/config/config_text.h"
#include "launcher/data/dataset.h"
#include "launcher/planning/trace_profile.h"
#include "alloc/cpu_device_allocator.h"
#include "planner/plan_report.h"
#include "runtime/thread_pools.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

namespace ht::bench {

std::vector<ConfigOverride> overrides_of(const JobSpec& job) {
  std::vector<ConfigOverride> out;
  for (const std::string& o : job.overrides) {
    const size_t eq = o.find('=');
    out.push_back({o.substr(0, eq), eq == std::string::npos ? "" : o.substr(eq + 1), "--" + o});
  }
  return out;
}

namespace {

std::string key_of(const JobSpec& job, const PlanArgs& a) {
  std::string k = job.config;
  for (const std::string& o : job.overrides) k += " " + o;
  k += " |";
  for (int r : a.ranks) k += " " + std::to_string(r);
  k += " | " + std::to_string(a.device_memory) + " |";
  for (MixedPrecision p : a.precisions) k += std::string(" ") + choice_name(p);
  k += " |";
  for (MemoryPolicy p : a.policies) k += std::string(" ") + choice_name(p);
  return k;
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string last_lines(const std::string& text, int n) {
  size_t at = text.size();
  while (n-- > 0 && at > 0) {
    const size_t nl = text.rfind('\n', at - 1);
    if (nl == std::string::npos) return text;
    at = nl;
  }
  return text.substr(at == text.size() ? at : at + 1);
}

// CPU seconds the whole machine spent busy (stolen time included), and this process's children's.
struct CpuTimes {
  double machine_s = 0, children_s = 0;
};

CpuTimes cpu_times() {
  CpuTimes t;
  std::ifstream stat("/proc/stat");
  std::string cpu;
  double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  if (stat >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal) {
    t.machine_s = (user + nice + system + irq + softirq + steal) / static_cast<double>(sysconf(_SC_CLK_TCK));
  }
  rusage r{};
  getrusage(RUSAGE_CHILDREN, &r);
  t.children_s = static_cast<double>(r.ru_utime.tv_sec + r.ru_stime.tv_sec) +
                 static_cast<double>(r.ru_utime.tv_usec + r.ru_stime.tv_usec) * 1e-6;
  return t;
}

// Runs `command` (stderr joined to stdout); returns its exit status and output.
std::pair<int, std::string> run_command(const std::string& command) {
  std::string output;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return {-1, "popen failed"};
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) output.append(buf, n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), output};
}

// The step's peak on the fullest rank: the first rank writes the records, with every stage's
// peak (a pipeline's; its replicas hold the same) and every replica's of its stage beside its own.
// A plan is predicted for its fullest rank: under pipeline stages that is rarely the first.
int64_t fullest_rank_peak(const std::string& line) {
  double peak = json_number(line, "mem_peak_bytes").value_or(0);
  for (const char* key : {"stage_peak_bytes", "rank_peak_bytes"})
    for (double p : json_numbers(line, key)) peak = std::max(peak, p);
  return static_cast<int64_t>(peak);
}

// Reads the run's train records into `m`: peak over every step and rank, times over the steps
// after warm-up.
void read_metrics(const std::string& path, Measurement& m) {
  std::ifstream in(path);
  std::string line;
  std::vector<double> step, recompute, comm, evictions;
  while (std::getline(in, line)) {
    if (line.find("\"event\": \"train\"") == std::string::npos) continue;
    ++m.steps;
    const int64_t peak = fullest_rank_peak(line);
    m.peak_bytes = std::max(m.peak_bytes, peak);
    if (m.steps == 1) m.first_peak_bytes = peak;
    else m.later_peak_bytes = std::max(m.later_peak_bytes, peak);
    step.push_back(json_number(line, "step_ms").value_or(0));
    recompute.push_back(json_number(line, "recompute_ms").value_or(0));
    comm.push_back(json_number(line, "comm_ms").value_or(0));
    evictions.push_back(json_number(line, "evictions").value_or(0));
  }
  if (step.empty()) return;
  // The first two steps page memory in, build optimizer state and, under mpirun, wait for the
  // slowest rank's start; they are not the step a plan runs at.
  const long skip = std::min<long>(2, static_cast<long>(step.size()) - 1);
  auto steady = [skip](const std::vector<double>& v) {
    return median(std::vector<double>(v.begin() + skip, v.end()));
  };
  m.step_ms = steady(step);
  m.steady.assign(step.begin() + skip, step.end());
  m.quiet_ms = quiet_ms(m.steady);
  m.fastest_ms = *std::min_element(step.begin() + skip, step.end());
  m.slowest_ms = *std::max_element(step.begin() + skip, step.end());
  m.recompute_ms = steady(recompute);
  m.comm_ms = steady(comm);
  m.evictions = steady(evictions);
}

}  // namespace

double quiet_ms(std::vector<double> steps) {
  if (steps.empty()) return 0;
  const auto at = static_cast<long>(steps.size() / 4);
  std::nth_element(steps.begin(), steps.begin() + at, steps.end());
  return steps[static_cast<size_t>(at)];
}

const Planned& PlanCache::get(const JobSpec& job, const PlanArgs& args) {
  std::unique_ptr<Planned>& slot = planned_[key_of(job, args)];
  if (slot) return *slot;
  auto p = std::make_unique<Planned>();
  p->config = load_config(job.config, overrides_of(job)).config;
  // As `hybrid_train plan` sets up before it profiles (plan_command.cpp).
  const Config& c = p->config;
  set_compute_threads(c.training.threads > 0 ? static_cast<int>(c.training.threads) : default_thread_count(1));
  set_host_memory_caching(c.memory.host_cache);
  const DataSplits data = make_datasets(c);
  const auto start = std::chrono::steady_clock::now();
  p->info = data.info;
  p->plan = plan_job(c, data.train.get(), data.info, args);
  p->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (print_profiles_) {
    std::printf("\nprofile of %s:\n%s\n", key_of(job, args).c_str(),
                profile_text(p->plan.profile, p->plan.machine).c_str());
  }
  slot = std::move(p);
  return *slot;
}

const ModelProfile& PlanCache::traced(const Planned& planned, const std::vector<MixedPrecision>& precisions,
                                      const std::vector<int64_t>& micro_batches) {
  std::string key = std::to_string(reinterpret_cast<uintptr_t>(&planned));  // a job's one Planned
  for (MixedPrecision p : precisions) key += std::string(" ") + choice_name(p);
  for (int64_t m : micro_batches) key += " " + std::to_string(m);
  auto found = traced_.find(key);
  if (found != traced_.end()) return found->second;
  TraceRequest request;
  request.precisions = precisions;
  request.workspaces = WorkspaceRules::kThisCpu;
  request.train_samples = planned.plan.profile.train_samples;
  request.micro_batches = micro_batches;  // each traced (under workspace rules none is derived)
  return traced_.emplace(key, trace_profile(planned.config, planned.info, request)).first->second;
}

// Two runs of one plan as one measurement: peaks the higher, step times over both runs' steps.
Measurement merge_runs(const Measurement& a, const Measurement& b) {
  if (!a.ok) return a;
  if (!b.ok) return b;
  Measurement m = a;
  m.peak_bytes = std::max(a.peak_bytes, b.peak_bytes);
  m.later_peak_bytes = std::max(a.later_peak_bytes, b.later_peak_bytes);
  m.steady.insert(m.steady.end(), b.steady.begin(), b.steady.end());
  m.steps += b.steps;
  m.step_ms = median(m.steady);
  m.quiet_ms = quiet_ms(m.steady);
  m.fastest_ms = std::min(a.fastest_ms, b.fastest_ms);
  m.slowest_ms = std::max(a.slowest_ms, b.slowest_ms);
  m.recompute_ms = (a.recompute_ms + b.recompute_ms) / 2;
  m.comm_ms = (a.comm_ms + b.comm_ms) / 2;
  m.evictions = std::max(a.evictions, b.evictions);
  m.wall_s = a.wall_s + b.wall_s;
  m.other_load = std::max(a.other_load, b.other_load);
  return m;
}

Measurement measure(const Runner& runner, const Config& config, const Plan& plan, int steps, const std::string& name) {
  namespace fs = std::filesystem;
  Measurement m;
  const fs::path dir = fs::path(runner.scratch) / name;
  fs::create_directories(dir);
  Config c = config_for_plan(config, plan);
  c.job.output_dir = (dir / "out").string();
  const fs::path toml = dir / "plan.toml";
  std::ofstream(toml) << resolved_toml(c);
  // A run that hangs (a rank lost under mpirun) must not hang the benchmark.
  std::string command = "timeout -k 10 900 ";
  if (plan.devices() > 1) {  // replicas x pipeline stages
    command += shell_quote(runner.mpirun) + " --allow-run-as-root --oversubscribe -np " +
               std::to_string(plan.devices()) + " ";
  }
  command += shell_quote(runner.binary) + " " + shell_quote(toml.string()) + " --training.steps=" +
             std::to_string(steps) +
             " --metrics.log_interval=1 --checkpoint.interval=0 --training.eval_interval=0 --training.eval_batches=1";
  const CpuTimes before = cpu_times();
  const auto start = std::chrono::steady_clock::now();
  const auto [status, output] = run_command(command);
  m.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Timings are only as good as the machine was quiet: what else ran, in cores (this process
  // waits in pclose and spends next to nothing).
  const CpuTimes after = cpu_times();
  m.other_load = std::max(0.0, (after.machine_s - before.machine_s) - (after.children_s - before.children_s)) /
                 std::max(m.wall_s, 1e-3);
  std::ofstream(dir / "output.txt") << output;
  if (status != 0) {
    // hybrid_train says what went wrong in one line; without one, its last words.
    const size_t at = output.find("error: ");
    const std::string why = at == std::string::npos ? last_lines(output, 3)
                                                    : output.substr(at, output.find('\n', at) - at);
    m.error = "exit status " + std::to_string(status) + ": " + why;
    return m;
  }
  read_metrics((dir / "out" / "metrics.jsonl").string(), m);
  m.ok = m.steps > 0;
  if (!m.ok) m.error = "no train records in " + (dir / "out" / "metrics.jsonl").string();
  return m;
}

std::string default_binary() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "hybrid_train";
  return (self.parent_path().parent_path() / "launcher" / "hybrid_train").string();
}

}  // namespace ht::bench

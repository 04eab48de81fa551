#pragma once
// The two halves of bench_planner_accuracy: the planner's side, a job profiled and searched in
// this process exactly as `hybrid_train plan` does it (plan_job), once per job and planning
// arguments; and the measured side, a plan trained by hybrid_train as a child process (under
// mpirun for several ranks), read back from its metrics.jsonl.

#include "launcher/config/config.h"
#include "launcher/config/config_loader.h"
#include "launcher/planning/job_plan.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace ht::bench {

// A config file and its overrides, "section.key=value".
struct JobSpec {
  std::string config;
  std::vector<std::string> overrides;
};
// The overrides as the config loader takes them.
std::vector<ConfigOverride> overrides_of(const JobSpec& job);

struct Planned {
  Config config;
  DataInfo info;
  JobPlan plan;         // the profile, the machine, and every candidate ranked
  double seconds = 0;   // profile and search
};

// Profiling costs seconds a job: each (job, arguments) is planned once.
class PlanCache {
 public:
  explicit PlanCache(bool print_profiles = false) : print_profiles_(print_profiles) {}
  const Planned& get(const JobSpec& job, const PlanArgs& args);
  // The same job's profile from traces alone (launcher/planning/trace_profile.h, this CPU's
  // kernel workspaces declared), each of `micro_batches` traced: its memory needs no run.
  const ModelProfile& traced(const Planned& planned, const std::vector<MixedPrecision>& precisions,
                             const std::vector<int64_t>& micro_batches);

 private:
  bool print_profiles_;
  std::map<std::string, std::unique_ptr<Planned>> planned_;
  std::map<std::string, ModelProfile> traced_;
};

// How plans are measured.
struct Runner {
  std::string binary;    // hybrid_train
  std::string mpirun;    // empty: single-rank plans only
  std::string scratch;   // a folder of this run's own, for the runs' configs and outputs
};

struct Measurement {
  bool ok = false;
  std::string error;       // when not ok: why, with the end of the run's output
  int64_t peak_bytes = 0;  // the highest mem_peak_bytes of any step (the arena's, rank 0)
  int64_t first_peak_bytes = 0, later_peak_bytes = 0;  // step 1's (no optimizer state yet), the rest's
  double step_ms = 0;      // median step after the warm-up steps
  double quiet_ms = 0;     // the fastest quarter's slowest (25th percentile) of the same steps
  std::vector<double> steady;  // the same steps' times, in order
  double fastest_ms = 0, slowest_ms = 0;  // of the same steps: how steady the machine was
  double recompute_ms = 0, comm_ms = 0, evictions = 0;  // medians over the same steps
  int steps = 0;           // train records read
  double wall_s = 0;       // the whole child run, profiling and start-up included
  double other_load = 0;   // cores' worth busy with other processes (or stolen) meanwhile
};

// The 25th percentile of `steps` (0 when empty): the machine unloaded, as the profile's fastest step.
double quiet_ms(std::vector<double> steps);

// Two runs of one plan as one measurement: peaks the higher, step times over both runs' steps.
Measurement merge_runs(const Measurement& a, const Measurement& b);

// Trains `plan` of `config` for `steps` steps as `name` (a folder under the scratch folder).
Measurement measure(const Runner& runner, const Config& config, const Plan& plan, int steps, const std::string& name);

// The hybrid_train next to this program's build folder (build/bench/x -> build/launcher/hybrid_train).
std::string default_binary();

}  // namespace ht::bench

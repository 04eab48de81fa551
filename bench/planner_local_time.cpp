// The local path's step times at every micro-batch size a plan may use, two ways side by side,
// against training the size again:
//   line   the profile as it was until 2026-11-29: two trained sizes (the largest micro-batch a
//          plan uses and an eighth of it), the forward and backward time affine in the
//          micro-batch between and beyond them;
//   every  the profile as `hybrid_train plan` makes it now: every power of two up to the largest
//          trained (launcher/planning/profiler.cpp, point_sizes).
// The measurement is a second profile of the same job, trained after the first: its forward and
// backward of one micro-batch at each size (the fastest of a few steps after a warm-up, as the
// profiler times them). `every`'s error is then two measurements of one size apart: the noise
// floor of this machine; the line's is that noise and its shape. Exits 1 when a job fails to
// profile; accuracy is reported, not enforced (the machine's speed drifts).
#include "bench/bench_util.h"
#include "bench/planner_rows.h"
#include "launcher/data/dataset.h"
#include "launcher/planning/job_plan.h"
#include "launcher/planning/profiler.h"
#include "planner/cost_model.h"
#include "runtime/thread_pools.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>

namespace ht::bench {
namespace {

struct LocalJob {
  std::string name;
  JobSpec job;
  std::vector<MixedPrecision> precisions{MixedPrecision::kOff};
};

struct Row {
  std::string model;
  MixedPrecision precision = MixedPrecision::kOff;
  int64_t micro = 0;
  bool line_trained = false;  // one of the line's two sizes
  double measured = 0, line = 0, every = 0;
};

double pct(double predicted, double measured) { return 100 * (predicted - measured) / measured; }

// The profile as the profiler made it before every size was trained: its points at the smallest
// size it trains first (an eighth of the largest) and the largest, nothing traced.
ModelProfile two_sizes(ModelProfile p, int64_t largest) {
  int64_t top = 0;
  for (const ProfilePoint& q : p.points) {
    if (!q.memory_traced && q.threads == p.threads) top = std::max(top, q.micro_batch);
  }
  const int64_t small = std::max<int64_t>(1, largest / 8);
  p.points.erase(std::remove_if(p.points.begin(), p.points.end(),
                                [&](const ProfilePoint& q) {
                                  return q.memory_traced || (q.micro_batch != small && q.micro_batch != top);
                                }),
                 p.points.end());
  return p;
}

std::vector<Row> job_rows(const LocalJob& job, const std::string& configs) {
  const Config c = load_config(configs + "/" + job.job.config, overrides_of(job.job)).config;
  set_compute_threads(c.training.threads > 0 ? static_cast<int>(c.training.threads) : default_thread_count(1));
  const DataSplits data = make_datasets(c);
  PlanArgs args;
  args.ranks = {1};
  args.precisions = job.precisions;
  const JobPlan plan = plan_job(c, data.train.get(), data.info, args);
  const ModelProfile& every = plan.profile;
  const int64_t largest = c.training.global_batch_size;
  const ModelProfile line = two_sizes(every, largest);
  ProfileRequest again;
  again.precisions = job.precisions;
  again.largest_micro_batch = largest;
  again.threads = every.threads;
  const ModelProfile measured = profile_job(c, *data.train, data.info, again);
  std::vector<Row> rows;
  for (const ProfilePoint& m : measured.points) {
    if (m.threads != measured.threads) continue;
    Row r{job.name, m.precision, m.micro_batch, false, m.forward_backward_ms};
    for (const ProfilePoint& l : line.points) r.line_trained |= l.micro_batch == m.micro_batch && l.precision == m.precision;
    r.line = forward_backward_ms(line, r.micro, r.precision, line.threads);
    r.every = forward_backward_ms(every, r.micro, r.precision, every.threads);
    rows.push_back(r);
  }
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    return std::tie(a.precision, a.micro) < std::tie(b.precision, b.micro);
  });
  std::printf("  %s: %s\n", job.name.c_str(), every.how.c_str());
  std::fflush(stdout);
  return rows;
}

}  // namespace
}  // namespace ht::bench

int main(int argc, char** argv) {
  using namespace ht;
  using namespace ht::bench;
  CLI::App app{"The local path's step times at every micro-batch size a plan may use: the line through two "
               "trained sizes against every size trained, both against a second profile"};
  bool quick = false;
  std::string configs = HT_SOURCE_DIR "/configs";
  app.add_flag("--quick", quick, "the ConvNet alone (a smoke test)");
  app.add_option("--configs", configs, "the project's configs/ folder");
  CLI11_PARSE(app, argc, argv);
  const auto start = std::chrono::steady_clock::now();

  std::vector<LocalJob> jobs{{"ConvNet", {"quickstart.toml", {}}}};
  if (!quick) {
    jobs.push_back({"ResNet-18", {"resnet18_fmnist.toml", {"training.global_batch_size=32"}}});
    jobs.push_back({"GPT-small", {"gpt_tiny.toml", {}}, {MixedPrecision::kOff, MixedPrecision::kBf16}});
    jobs.push_back({"GPT-large", {"gpt_tiny.toml", {"model.n_layer=4", "model.n_embd=128"}}});
  }
  std::vector<Row> rows;
  try {
    std::printf("profiles (as `hybrid_train plan --ranks 1` makes them):\n");
    for (const LocalJob& job : jobs) {
      const std::vector<Row> r = job_rows(job, configs);
      rows.insert(rows.end(), r.begin(), r.end());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_planner_local_time: %s\n", e.what());
    return 1;
  }
  std::printf("\nforward and backward of one micro-batch, ms: a second profile's measurement against the "
              "first's predictions (line: two of its sizes; every: all)\n");
  std::printf("| model     | prec | micro | line's |  measured |     line |  err %% |    every |  err %% |\n");
  std::printf("|-------------------------------------------------------------------------------------|\n");
  std::vector<double> line_err, every_err, floor;
  for (const Row& r : rows) {
    std::printf("| %-9s | %-4s | %5lld | %-6s | %9.2f | %8.2f | %+6.1f | %8.2f | %+6.1f |\n", r.model.c_str(),
                choice_name(r.precision), static_cast<long long>(r.micro), r.line_trained ? "yes" : "no", r.measured,
                r.line, pct(r.line, r.measured), r.every, pct(r.every, r.measured));
    (r.line_trained ? floor : line_err).push_back(std::abs(pct(r.line, r.measured)));
    if (!r.line_trained) every_err.push_back(std::abs(pct(r.every, r.measured)));
  }
  auto most = [](const std::vector<double>& v) { return v.empty() ? NAN : *std::max_element(v.begin(), v.end()); };
  std::printf("\nsizes the line did not train (%zu): |error| of the line: median %.1f%%, max %.1f%%; of every size "
              "trained: median %.1f%%, max %.1f%%\n",
              line_err.size(), median(line_err), most(line_err), median(every_err), most(every_err));
  std::printf("the line's own two sizes (%zu), measured twice: median %.1f%%, max %.1f%% apart\n", floor.size(),
              median(floor), most(floor));
  std::printf("wall time %.0f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return 0;
}

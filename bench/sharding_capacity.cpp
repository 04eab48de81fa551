// The largest model that trains in a fixed per-rank memory, sharded and not: a GPT at a fixed
// width (the "layers at fixed width, batch 1, T 128"), deepened layer by layer. For each
// rank count and parallel.shard level, two searches over the layer count:
//  - measured: hybrid_train trains it for 2 steps under mpirun with memory.budget set and
//    memory.check_fit = false (no planner in the way: it fits when no allocation fails);
//  - predicted: the planner (plan_job, as `hybrid_train plan` does it) says the plan of that many
//    ranks, micro-batch 1, no eviction, at that level, fits the budget.
// Both searches are binary (fitting is monotone in the layers). Exits 1 when a prediction is more
// than 10% (and more than one layer) off the measurement. Activations are not sharded, so the
// gain from sharding is below N; this measures how far below.
#include "bench/bench_util.h"
#include "bench/planner_rows.h"
#include "base/remove_tree.h"
#include "launcher/config/config_loader.h"
#include "launcher/planning/model_size.h"

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace ht::bench {
namespace {

struct Options {
  int64_t width = 768, heads = 12, seq = 128, max_layers = 24;
  std::string budget = "1GiB";
  std::vector<int> ranks{2, 4};
  Runner runner;
};

std::string gpt_toml(const Options& o) {
  return "[model]\nname = \"gpt\"\nn_layer = 1\nn_head = " + std::to_string(o.heads) + "\nn_embd = " +
         std::to_string(o.width) + "\nblock_size = " + std::to_string(o.seq) + "\ndropout = 0\n" +
         "[data]\ndataset = \"synthetic\"\nsynthetic_samples = 64\nsynthetic_eval_samples = 8\nsynthetic_shape = [" +
         std::to_string(o.seq) + "]\nsynthetic_classes = 256\n[training]\nsteps = 2\noptimizer = \"adamw\"\n";
}

// The largest n in [1, hi] with fits(n) (monotone), or 0.
int64_t largest(int64_t hi, const std::function<bool(int64_t)>& fits) {
  int64_t lo = 0;  // fits(lo) holds (0: nothing to fit)
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (fits(mid)) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

struct Row {
  int ranks;
  ShardLevel level;
  int64_t measured = 0, predicted = 0;
  std::map<int64_t, std::string> failures;  // by layer count: why it did not train
  std::string failure() const {  // why one layer more than the largest did not
    const auto it = failures.find(measured + 1);
    return it == failures.end() ? "" : it->second;
  }
};

Row search(const Options& o, const std::string& toml, int ranks, ShardLevel level, PlanCache& plans) {
  Row row{ranks, level};
  const std::vector<std::string> common{"training.global_batch_size=" + std::to_string(ranks),
                                        "memory.budget=" + o.budget, "memory.check_fit=false"};
  auto job_at = [&](int64_t layers) {
    JobSpec job{toml, common};
    job.overrides.push_back("model.n_layer=" + std::to_string(layers));
    return job;
  };
  PlanArgs args;
  args.ranks = {ranks};
  args.stages = {1};
  args.precisions = {MixedPrecision::kOff};
  args.policies = {MemoryPolicy::kNone};
  args.shards = {ShardLevel::kNone, ShardLevel::kOptimizer, ShardLevel::kGradients, ShardLevel::kParameters};
  // The plan of this many ranks at this level, micro-batch 1 (the only one a batch of 1 a rank has).
  auto plan_at = [&](int64_t layers) -> const RankedPlan* {
    for (const RankedPlan& r : plans.get(job_at(layers), args).plan.ranked) {
      if (r.plan.ranks == ranks && r.plan.shard == level && r.plan.stages == 1) return &r;
    }
    return nullptr;
  };
  row.predicted = largest(o.max_layers, [&](int64_t layers) {
    const RankedPlan* r = plan_at(layers);
    return r != nullptr && r->prediction.fits;
  });
  row.measured = largest(o.max_layers, [&](int64_t layers) {
    const RankedPlan* r = plan_at(layers);
    if (r == nullptr) return false;
    const Planned& planned = plans.get(job_at(layers), args);
    const std::string name = "n" + std::to_string(ranks) + "_" + choice_name(level) + "_L" + std::to_string(layers);
    const Measurement m = measure(o.runner, planned.config, r->plan, 2, name);
    std::printf("  %d ranks, %-9s %3lld layers: %s\n", ranks, choice_name(level), static_cast<long long>(layers),
                m.ok ? "trains" : m.error.substr(0, 140).c_str());
    std::fflush(stdout);
    if (!m.ok) row.failures[layers] = m.error;
    return m.ok;
  });
  return row;
}

// "exit status 2: error: rank 0: <file>: memory.budget ... is too small ..." -> from "memory.budget"
// or "model.name" on, at most 110 characters.
std::string shorter(const std::string& why) {
  size_t at = why.find(".toml: ");
  const std::string tail = at == std::string::npos ? why : why.substr(at + 7);
  return tail.size() > 110 ? tail.substr(0, 107) + "..." : tail;
}

}  // namespace
}  // namespace ht::bench

int main(int argc, char** argv) {
  using namespace ht::bench;
  Options o;
  o.runner.binary = default_binary();
#ifdef HT_MPIEXEC
  o.runner.mpirun = HT_MPIEXEC;
#endif
  bool quick = false;
  std::string scratch = "/tmp/ht_bench_sharding_capacity";
  CLI::App app{"The largest GPT (layers at a fixed width) that trains in a fixed per-rank budget, parallel.shard = "
               "none, optimizer, gradients and parameters: measured against the planner's prediction"};
  std::vector<std::string> levels{"none", "optimizer", "gradients", "parameters"};
  app.add_option("--levels", levels, "parallel.shard levels (none's row is the ratios' base)")->delimiter(',');
  app.add_option("--budget", o.budget, "memory.budget per rank");
  app.add_option("--width", o.width, "n_embd");
  app.add_option("--heads", o.heads, "n_head");
  app.add_option("--seq", o.seq, "block_size T (batch 1 a rank)");
  app.add_option("--max-layers", o.max_layers, "the deepest model tried")->check(CLI::PositiveNumber);
  app.add_option("--ranks", o.ranks, "rank counts")->delimiter(',');
  app.add_option("--binary", o.runner.binary, "hybrid_train");
  app.add_option("--mpirun", o.runner.mpirun, "mpirun");
  app.add_option("--scratch", scratch, "a folder for the runs (emptied first)");
  app.add_flag("--quick", quick, "a smoke run: width 64, T 32, 2 ranks, 5 MiB, at most 10 layers");
  CLI11_PARSE(app, argc, argv);
  if (quick) {
    o.width = 64, o.heads = 2, o.seq = 32, o.max_layers = 10, o.budget = "5MiB", o.ranks = {2};
  }
  if (o.runner.mpirun.empty()) {
    std::fprintf(stderr, "bench_sharding_capacity: needs mpirun (--mpirun; none found at build time)\n");
    return 2;
  }
  ht::remove_tree(scratch);  // a scratch folder of this program's own
  std::filesystem::create_directories(scratch);
  o.runner.scratch = scratch;
  const std::string toml = scratch + "/gpt.toml";
  std::ofstream(toml) << gpt_toml(o);
  std::printf("bench_sharding_capacity: GPT at n_embd %lld, %lld heads, T %lld, batch 1 a rank, AdamW, fp32, "
              "memory.budget = %s a rank, no eviction; runs in %s\n\n",
              static_cast<long long>(o.width), static_cast<long long>(o.heads), static_cast<long long>(o.seq),
              o.budget.c_str(), scratch.c_str());
  PlanCache plans;
  std::vector<Row> rows;
  for (int n : o.ranks) {
    for (const std::string& name : levels) {
      const std::optional<ht::ShardLevel> level = ht::parse_choice<ht::ShardLevel>(name);
      if (!level) {
        std::fprintf(stderr, "bench_sharding_capacity: --levels: \"%s\" is not a level; use none, optimizer, "
                     "gradients or parameters\n", name.c_str());
        return 2;
      }
      rows.push_back(search(o, toml, n, *level, plans));
    }
  }
  std::printf("\n| ranks | parallel.shard | largest model, measured (layers) | parameters | predicted (layers) | "
              "vs none | what stopped one more layer |\n| --- | --- | --- | --- | --- | --- | --- |\n");
  bool ok = true;
  for (const Row& r : rows) {
    const Row* none = nullptr;  // this rank count's unsharded row, if measured
    for (const Row& q : rows) {
      if (q.ranks == r.ranks && q.level == ht::ShardLevel::kNone) none = &q;
    }
    const std::string layers = std::to_string(std::max<int64_t>(r.measured, 1));
    const ht::Config c = ht::load_config(toml, {{"model.n_layer", layers, "--model.n_layer=" + layers}}).config;
    const auto size = ht::model_state_from_shape(c, 256);
    const int64_t off = std::abs(r.predicted - r.measured);
    ok = ok && (off <= 1 || off <= r.measured / 10);
    std::printf("| %d | %s | %lld | %s | %lld | %.2fx | %s |\n", r.ranks, ht::choice_name(r.level),
                static_cast<long long>(r.measured), size ? std::to_string(size->parameters).c_str() : "?",
                static_cast<long long>(r.predicted),
                none != nullptr && none->measured > 0 ? static_cast<double>(r.measured) / static_cast<double>(none->measured)
                                                      : 0.0,
                r.measured >= o.max_layers ? "(--max-layers)" : shorter(r.failure()).c_str());
  }
  if (!ok) std::printf("\nFAILED: a prediction is more than 10%% (and one layer) off the measurement\n");
  return ok ? 0 : 1;
}

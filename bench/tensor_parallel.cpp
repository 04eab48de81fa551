// Tensor and sequence parallelism (parallel.tensor_parallel, parallel.sequence_parallel) on this
// machine, in one invocation:
// 1. activation bytes one decoder layer saves per rank at t = 1, 2, 4, with and without sequence
//    parallelism, measured on thread ranks (parallel/thread_group.h, each with its own memory
//    manager: the resident bytes a middle layer's forward adds), as a ratio to t = 1, beside this
//    project's accounting (planner/tensor_terms.h, tensor by tensor) and Korthikanti et al.'s
//    ratio; exits 1 when a measurement is more than 5% off the accounting;
// 2. elements handed to the group's collectives per layer per rank (a model of L + 1 layers minus
//    one of L), forward and backward, counted by the group, against the layout's formula (2 b s h
//    in two all-reduces each way; with SP 2 b s h in an all-gather and a reduce-scatter pair each
//    way, and 2 b s h of all-gathers backward repeats to save the gathered inputs); exits 1 when
//    they differ;
// 3. the step at t = 2 on 2 CPU ranks (mpirun) against one rank at the same global batch, each
//    beside the planner's prediction (plan_job, as `hybrid_train plan --tensor 1,2` makes it);
// 4. the longest sequence that trains within a fixed per-rank budget (memory.budget, no
//    eviction) at t = 4 with SP (mpirun -np 4) against one rank.
#include "base/remove_tree.h"
#include "bench/bench_util.h"
#include "bench/planner_rows.h"
#include "memory/memory_manager.h"
#include "models/decoder.h"
#include "parallel/thread_group.h"
#include "planner/tensor_terms.h"
#include "runtime/thread_pools.h"

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#ifndef HT_MPIEXEC
#define HT_MPIEXEC "mpirun"
#endif

namespace ht::bench {
namespace {

// What one split run of a micro-batch shows on rank 0.
struct RankRun {
  int64_t layer_bytes = 0;                      // resident bytes layer h1's forward added
  std::map<std::string, int64_t> forward, all;  // elements by use: after forward, after backward
};

RankRun run_split(DecoderOptions o, int t, bool sp, int64_t batch) {
  o.tensor_parallel = t;
  o.sequence_parallel = sp && t > 1;
  std::vector<std::unique_ptr<Decoder>> parts;
  for (int r = 0; r < t; ++r) {
    DecoderOptions p = o;
    p.tensor_rank = r;
    at::manual_seed(3);
    parts.push_back(std::make_unique<Decoder>(p));
  }
  at::manual_seed(4);
  const at::Tensor tokens = at::randint(0, o.vocab_size, {batch, o.block_size}, at::kLong);
  RankRun out;
  run_ranks(t, [&](int rank, ThreadGroup& group) {
    MemoryManager memory;
    Interpreter interp({}, &memory);
    if (t > 1) interp.set_tensor_parallel(&group);
    Decoder& model = *parts[rank];
    int64_t before = 0, layer = 0;
    model.set_block_listener([&](int block) {  // block 2 is the second layer, h1
      if (block == 2) before = memory.stats().resident_bytes;
      if (block == 3) layer = memory.stats().resident_bytes - before;
    });
    const Tensor loss = model.loss(model.forward(interp.input(tokens)), interp.input(tokens));
    const std::map<std::string, int64_t> forward = group.elements_by_use();
    interp.backward(loss);
    if (rank == 0) out = {layer, forward, group.elements_by_use()};
  });
  return out;
}

// Korthikanti et al.'s activations per layer (16-bit, with stored attention scores), as a ratio to
// t = 1: sbh(10 + 24/t + 5as/(ht)) without SP, (sbh/t)(34 + 5as/h) with it.
double korthikanti_ratio(const TensorShape& s, int t, bool sp) {
  const double score = 5.0 * static_cast<double>(s.heads * s.sequence) / static_cast<double>(s.hidden);
  const double one = 34.0 + score;
  return sp ? 1.0 / t : (10.0 + 24.0 / t + score / t) / one;
}

bool activations_table(const std::vector<std::pair<std::string, DecoderOptions>>& models, int64_t batch) {
  bool ok = true;
  std::printf("\n1. activation bytes one layer saves per rank (fp32, micro-batch %lld), as a ratio to t = 1:\n\n",
              static_cast<long long>(batch));
  std::printf("| %-34s | %2s | %3s | %10s | %10s | %8s | %10s | %12s | %6s |\n", "model", "t", "SP", "measured",
              "accounted", "off", "ratio", "Korthikanti", "within");
  std::printf("|%s|\n", std::string(121, '-').c_str());
  for (const auto& [name, o] : models) {
    const TensorShape shape = tensor_shape(o);
    const double one = static_cast<double>(run_split(o, 1, false, batch).layer_bytes);
    for (int t : {1, 2, 4}) {
      for (bool sp : {false, true}) {
        if (t == 1 && sp) continue;
        const int64_t measured = run_split(o, t, sp, batch).layer_bytes;
        const int64_t accounted = layer_activation_bytes(shape, batch, t, sp);
        const double off = static_cast<double>(measured) / static_cast<double>(accounted) - 1.0;
        const bool within = std::abs(off) <= 0.05;
        ok &= within;
        std::printf("| %-34s | %2d | %3s | %10lld | %10lld | %+7.1f%% | %10.3f | %12.3f | %6s |\n", name.c_str(), t,
                    sp ? "yes" : "no", static_cast<long long>(measured), static_cast<long long>(accounted), 100 * off,
                    static_cast<double>(measured) / one, korthikanti_ratio(shape, t, sp), within ? "yes" : "NO");
      }
    }
  }
  std::printf("\n(accounted: planner/tensor_terms.h, layer_activation_bytes; Korthikanti et al.'s ratio counts "
              "16-bit tensors and the T x T scores this project's attention never stores)\n");
  return ok;
}

int64_t used(const std::map<std::string, int64_t>& by_use, const std::string& what) {
  auto it = by_use.find(what);
  return it == by_use.end() ? 0 : it->second;
}

bool traffic_table(const DecoderOptions& base, int64_t batch) {
  bool ok = true;
  const int64_t e = batch * base.block_size * base.n_embd;  // b s h
  std::printf("\n2. elements handed to the group's collectives per layer per rank (llama, b s h = %lld), counted "
              "by the group (a model of 3 layers minus one of 2) against the layout's formula:\n\n",
              static_cast<long long>(e));
  std::printf("| %2s | %3s | %12s | %12s | %12s | %12s | %12s | %12s | %8s | %5s |\n", "t", "SP", "forward", "formula",
              "backward", "formula", "re-gathered", "formula", "weights", "equal");
  std::printf("|%s|\n", std::string(127, '-').c_str());
  for (int t : {2, 4}) {
    for (bool sp : {false, true}) {
      DecoderOptions two = base, three = base;
      two.n_layer = 2;
      three.n_layer = 3;
      const RankRun a = run_split(two, t, sp, batch), b = run_split(three, t, sp, batch);
      auto per_layer = [&](const std::map<std::string, int64_t>& x, const std::map<std::string, int64_t>& y,
                           const std::vector<std::string>& uses) {
        int64_t n = 0;
        for (const std::string& u : uses) n += used(y, u) - used(x, u);
        return n;
      };
      const std::vector<std::string> forward_uses = {"g's all-reduce (forward)", "sequence parallelism's all-gather (forward)",
                                                     "sequence parallelism's reduce-scatter (forward)"};
      const std::vector<std::string> backward_uses = {"f's all-reduce (backward)", "sequence parallelism's all-gather (backward)",
                                                      "sequence parallelism's reduce-scatter (backward)"};
      const int64_t forward = per_layer(a.forward, b.forward, forward_uses);
      // With SP no activation passes f: its all-reduces are the norms' weights' gradients.
      const std::vector<std::string> f = {"f's all-reduce (backward)"};
      const int64_t weights = sp ? per_layer(a.all, b.all, f) : 0;
      const int64_t backward = per_layer(a.all, b.all, backward_uses) - weights;
      const int64_t again = per_layer(a.all, b.all, {"sequence parallelism's all-gather again (backward)"});
      // Two all-reduces of b s h each way; with SP an all-gather and a reduce-scatter of the whole
      // b s h for each of the two, each way, and the all-gathers of the two gathering linears again.
      const int64_t forward_formula = sp ? 4 * e : 2 * e, backward_formula = sp ? 4 * e : 2 * e, again_formula = sp ? 2 * e : 0;
      const bool equal = forward == forward_formula && backward == backward_formula && again == again_formula &&
                         weights == (sp ? 2 * base.n_embd : 0);
      ok &= equal;
      std::printf("| %2d | %3s | %12lld | %12lld | %12lld | %12lld | %12lld | %12lld | %8lld | %5s |\n", t, sp ? "yes" : "no",
                  static_cast<long long>(forward), static_cast<long long>(forward_formula), static_cast<long long>(backward),
                  static_cast<long long>(backward_formula), static_cast<long long>(again),
                  static_cast<long long>(again_formula), static_cast<long long>(weights), equal ? "yes" : "NO");
    }
  }
  std::printf("\n(a ring moves (t-1)/t of an all-gather's or reduce-scatter's whole per rank and twice that of an "
              "all-reduce: the same bytes with SP forward, 1.5x backward for the re-gathers; \"weights\": the norms' "
              "gradients summed over the group with SP, h each; recomputations repeat none of these without a budget)\n");
  return ok;
}

// The job parts 3 and 4 train: a Llama whose activations dominate, on the GPL's characters.
std::string write_job(const std::string& scratch) {
  const std::string path = scratch + "/job.toml";
  std::ofstream(path) << R"([model]
name = "llama"
n_layer = 4
n_head = 8
n_kv_heads = 4
n_embd = 128
multiple_of = 32
block_size = 256
[data]
dataset = "text"
path = "/usr/share/common-licenses/GPL-3"
[training]
steps = 10
global_batch_size = 8
optimizer = "adamw"
)";
  return path;
}

const RankedPlan* find_plan(const JobPlan& plan, int tensor, int devices) {
  for (const RankedPlan& r : plan.ranked) {
    const Plan& p = r.plan;
    if (p.tensor == tensor && p.devices() == devices && p.accumulation == 1 && p.policy == MemoryPolicy::kNone &&
        p.shard == ShardLevel::kNone && p.stages == 1 && p.precision == MixedPrecision::kOff) {
      return &r;
    }
  }
  return nullptr;
}

bool step_table(const Runner& runner, const std::string& job, int steps) {
  PlanCache cache;
  PlanArgs args;
  args.ranks = {1, 2};
  args.stages = {1};
  args.tensor = {1, 2};
  args.precisions = {MixedPrecision::kOff};
  args.policies = {MemoryPolicy::kNone};
  args.shards = {ShardLevel::kNone};
  const Planned& planned = cache.get(JobSpec{job, {}}, args);
  std::printf("\n3. the step at the same global batch (%lld), trained (median of steps 3..%d) beside the planner's "
              "prediction (plan_job on %s):\n\n",
              static_cast<long long>(planned.config.training.global_batch_size), steps,
              planned.plan.machine.description.c_str());
  std::printf("| %-36s | %10s | %10s | %7s | %12s | %10s |\n", "layout", "predicted", "measured", "off", "collectives",
              "speed-up");
  std::printf("|%s|\n", std::string(104, '-').c_str());
  bool ok = true;
  double one_ms = 0, one_predicted = 0;
  for (const auto& [tensor, devices] : {std::pair<int, int>{1, 1}, {2, 2}}) {
    const RankedPlan* r = find_plan(planned.plan, tensor, devices);
    if (r == nullptr) {
      std::printf("| no plan of %d ranks split %d ways\n", devices, tensor);
      ok = false;
      continue;
    }
    const Measurement m = measure(runner, planned.config, r->plan, steps, "step_t" + std::to_string(tensor));
    if (!m.ok) {
      std::printf("| %-36s | failed: %s\n", describe_plan(r->plan).c_str(), m.error.c_str());
      ok = false;
      continue;
    }
    if (tensor == 1) {
      one_ms = m.step_ms;
      one_predicted = r->prediction.step_ms;
    }
    std::printf("| %-36s | %8.1f ms | %8.1f ms | %+6.1f%% | %9.1f ms | %4.2fx (%4.2fx) |\n", describe_plan(r->plan).c_str(),
                r->prediction.step_ms, m.step_ms, 100 * (r->prediction.step_ms / m.step_ms - 1), r->prediction.tensor_ms,
                one_ms / m.step_ms, one_predicted / r->prediction.step_ms);
  }
  std::printf("\n(speed-up: one rank's step over this one's, measured (predicted); \"collectives\": the predicted "
              "time of the group's collectives, on the critical path)\n");
  return ok;
}

// Whether `job` at `block_size` trains 2 steps within `budget` per rank at tensor_parallel t.
bool trains(const Runner& runner, const std::string& job, int t, int64_t block_size, const std::string& budget) {
  const std::string out = runner.scratch + "/seq_t" + std::to_string(t) + "_" + std::to_string(block_size);
  std::string command = "timeout -k 10 600 ";
  if (t > 1) command += runner.mpirun + " --allow-run-as-root --oversubscribe -np " + std::to_string(t) + " ";
  command += runner.binary + " " + job + " --training.steps=2 --training.global_batch_size=1 --training.threads=1" +
             " --model.block_size=" + std::to_string(block_size) + " --memory.budget=" + budget +
             " --memory.check_fit=false --training.eval_batches=1 --checkpoint.interval=0 --job.output_dir=" + out;
  if (t > 1) command += " --parallel.tensor_parallel=" + std::to_string(t) + " --parallel.sequence_parallel=true";
  const int status = std::system((command + " > " + out + ".log 2>&1").c_str());
  remove_tree(out);
  return status == 0;
}

// The longest block size (a multiple of 64) that trains: doubling, then halving the gap.
int64_t longest(const Runner& runner, const std::string& job, int t, const std::string& budget, int64_t cap) {
  int64_t good = 0, bad = 0;
  for (int64_t s = 64; s <= cap; s *= 2) {
    if (!trains(runner, job, t, s, budget)) {
      bad = s;
      break;
    }
    good = s;
  }
  if (good == 0 || bad == 0) return good;
  while (bad - good > 64) {
    const int64_t mid = (good + bad) / 2 / 64 * 64;
    (trains(runner, job, t, mid, budget) ? good : bad) = mid;
  }
  return good;
}

bool sequence_table(const Runner& runner, const std::string& job, const std::string& budget, int64_t cap) {
  std::printf("\n4. the longest sequence (block_size, a multiple of 64, micro-batch 1) that trains within "
              "memory.budget = %s per rank, no eviction:\n\n", budget.c_str());
  std::printf("| %-30s | %12s | %8s | %8s |\n", "layout", "longest", "ratio", "target");
  std::printf("|%s|\n", std::string(70, '-').c_str());
  const int64_t one = longest(runner, job, 1, budget, cap);
  const int64_t four = longest(runner, job, 4, budget, cap);
  std::printf("| %-30s | %12lld | %8s | %8s |\n", "1 rank", static_cast<long long>(one), "1.00x", "");
  const double ratio = one > 0 ? static_cast<double>(four) / static_cast<double>(one) : 0;
  std::printf("| %-30s | %12lld | %7.2fx | %8s |\n", "4 ranks, t = 4 with SP", static_cast<long long>(four), ratio,
              ">= 3x");
  if (four >= cap) std::printf("\n(t = 4 reached the cap of %lld: the ratio is at least this)\n", static_cast<long long>(cap));
  return one > 0 && four > 0;
}

}  // namespace
}  // namespace ht::bench

int main(int argc, char** argv) {
  using namespace ht;
  using namespace ht::bench;
  ht::restart_with_passive_openmp(argv);  // as hybrid_train: the profile must time what its runs time
  CLI::App app{"Tensor and sequence parallelism: activations and traffic per layer against their terms, the step "
               "at t = 2 against one rank with the planner's prediction, the longest sequence in a budget at t = 4"};
  bool quick = false;
  std::string binary = default_binary(), scratch, budget = "24MiB";
  int steps = 10;
  int64_t cap = 8192;
  app.add_flag("--quick", quick, "small shapes, parts 1 and 2 only (the smoke test)");
  app.add_option("--binary", binary, "hybrid_train (parts 3 and 4)");
  app.add_option("--scratch", scratch, "a folder for the runs (default: a new one under /tmp)");
  app.add_option("--steps", steps, "steps of each timed run");
  app.add_option("--budget", budget, "part 4's memory.budget per rank");
  app.add_option("--cap", cap, "part 4's longest block size tried");
  CLI11_PARSE(app, argc, argv);

  DecoderOptions llama = DecoderOptions::llama(96, quick ? 32 : 256, 2, 8, 4, quick ? 64 : 256);
  llama.multiple_of = 64;
  const DecoderOptions gpt = DecoderOptions::gpt2(96, quick ? 32 : 256, 2, 8, quick ? 64 : 256, 0.0);
  const int64_t batch = 2;
  bool ok = activations_table({{"llama, h " + std::to_string(llama.n_embd) + ", 8 heads over 4", llama},
                               {"gpt, h " + std::to_string(gpt.n_embd) + ", 8 heads", gpt}},
                              batch);
  ok &= traffic_table(llama, batch);
  if (!quick) {
    if (scratch.empty()) scratch = std::filesystem::temp_directory_path() / ("bench_tensor_parallel_" + std::to_string(::getpid()));
    std::filesystem::create_directories(scratch);
    const Runner runner{binary, HT_MPIEXEC, scratch};
    const std::string job = write_job(scratch);
    ok &= step_table(runner, job, steps);
    ok &= sequence_table(runner, job, budget, cap);
  }
  std::printf("\n%s\n", ok ? "ok" : "FAILED: a measurement is off its term (see the tables)");
  return ok ? 0 : 1;
}

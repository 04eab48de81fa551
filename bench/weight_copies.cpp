// training.compute_weights (issue 65): the whole bf16 step of the 6-layer Llama (configs/llama_small's
// shape, synthetic tokens) with its 16-bit weights kept (copies made once per optimizer step)
// against a cast at every read (autocast's, the layout before), side by side in one invocation:
// jobs of each alternate for --reps rounds, and each side's median step time (the first step of
// a job, which casts, left out) and their ratio are printed. Kept copies must train the same
// bits: exits 1 if the two sides' parameters differ.
//
//   bench_weight_copies [--reps 3] [--steps 4] [--micro-batch 4] [--threads 1] [--quick]
#include "bench/bench_main.h"
#include "bench/bench_util.h"
#include "launcher/config/config_loader.h"
#include "launcher/job.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace ht {
namespace {

struct Side {
  const char* mode;
  std::vector<double> step_ms;
  double made = 0, copies_mb = 0;
  std::vector<at::Tensor> params;
};

// Every train record's number for `key` in a run's metrics.jsonl, in order.
std::vector<double> train_numbers(const std::string& metrics, const std::string& key) {
  std::ifstream in(metrics);
  std::vector<double> out;
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"train\"") == std::string::npos) continue;
    if (const std::optional<double> v = bench::json_number(line, key)) out.push_back(*v);
  }
  return out;
}

std::vector<at::Tensor> parameters_of(const Model& m) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

}  // namespace
}  // namespace ht

int main(int argc, char** argv) {
  using namespace ht;
  CLI::App app{"Kept 16-bit weight copies against a cast at every read: the 6-layer Llama's bf16 step"};
  bench::StepOptions o;
  o.reps = 3;
  int steps = 4, micro = 4;
  bool quick = false;
  bench::add_step_options(app, o);
  app.add_option("--steps", steps, "steps per job (the first, which casts, is not timed)")->check(CLI::Range(2, 1000));
  app.add_option("--micro-batch", micro, "micro-batch size (global batch 16)")->check(CLI::Range(1, 16));
  app.add_flag("--quick", quick, "2 layers, 64 positions (a smoke test)");
  CLI11_PARSE(app, argc, argv);
  const ThreadPools pools = bench::use_threads(o.threads);
  const std::string scratch = (std::filesystem::temp_directory_path() / "bench_weight_copies").string();
  const std::string toml = std::string(R"([model]
name = "llama"
n_layer = )") + (quick ? "2" : "6") + R"(
n_head = 8
n_kv_heads = 4
n_embd = 256
multiple_of = 64
block_size = )" + (quick ? "64" : "256") + R"(
vocab_size = 4096
[data]
dataset = "synthetic"
synthetic_samples = 256
synthetic_eval_samples = 16
[training]
global_batch_size = 16
optimizer = "adamw"
lr = 0.002
weight_decay = 0.1
grad_clip = 1.0
mixed_precision = "bf16"
[metrics]
log_interval = 1
)";
  std::printf("bf16 step of a %s-layer Llama (h 256, s %s, global batch 16, micro-batch %d), threads %s\n", quick ? "2" : "6",
              quick ? "64" : "256", micro, pools.describe().c_str());
  std::vector<Side> sides = {{"cast"}, {"kept"}};
  for (int round = 0; round < o.reps; ++round) {
    for (Side& side : sides) {
      const std::string out = scratch + "/" + side.mode;
      std::filesystem::remove_all(out);
      std::filesystem::create_directories(out);
      const std::string file = out + "/job.toml";
      std::ofstream(file) << toml;
      std::vector<ConfigOverride> overrides;
      for (const std::string& a : {"--job.output_dir=" + out, "--training.steps=" + std::to_string(steps),
                                   "--training.micro_batch_size=" + std::to_string(micro),
                                   std::string("--training.compute_weights=") + side.mode}) {
        overrides.push_back(override_of(a));
      }
      const Config config = load_config(file, overrides).config;
      const JobOutcome job = run_job(config, true);
      const std::string metrics = out + "/metrics.jsonl";
      const std::vector<double> ms = train_numbers(metrics, "step_ms");
      side.step_ms.insert(side.step_ms.end(), ms.begin() + 1, ms.end());
      if (side.mode == std::string("kept")) {
        side.made = train_numbers(metrics, "weight_copies_made").back();
        side.copies_mb = train_numbers(metrics, "weight_copies_bytes").back() / 1e6;
      }
      side.params = parameters_of(*job.model);
    }
  }
  bool same = true;
  for (size_t i = 0; i < sides[0].params.size(); ++i) same = same && sides[0].params[i].equal(sides[1].params[i]);
  const double cast = bench::median(sides[0].step_ms), kept = bench::median(sides[1].step_ms);
  std::printf("\n| weights | step ms (median of %zu) | vs cast | copies made a step | copies' MB | bits |\n",
              sides[0].step_ms.size());
  std::printf("| --- | --- | --- | --- | --- | --- |\n");
  std::printf("| cast at every read (before) | %.1f | 1.00x | %d micro-batches x each weight | 0 | |\n", cast, 16 / micro);
  std::printf("| kept (made once a step) | %.1f | %.3fx | %.0f | %.2f | %s |\n", kept, kept / cast, sides[1].made,
              sides[1].copies_mb, same ? "same" : "DIFFER");
  std::filesystem::remove_all(scratch);
  if (!same) {
    std::fprintf(stderr, "bench_weight_copies: the kept copies trained other parameters than the casts\n");
    return 1;
  }
  return 0;
}

// checkpoint.async against the checkpoint training waits for, side by side in one invocation:
// hybrid_train trains the same job twice as a child process (once per mode, in alternation, each
// --reps times) on a model whose state is a few hundred MB, checkpointing every few steps, and
// the table gives, each apart, from metrics.jsonl's checkpoint and train records:
//
//   blocked   the time training stood still for a checkpoint (waiting: the whole save; async: the
//             copy to host memory)
//   write     async: the files' writing on their thread (the waiting run's is inside "blocked")
//   publish   async: every rank's outcome agreed, and the rename
//   waited    async: a checkpoint step's wait for the write before it (one is in flight at most)
//   steps     the median step, of steps with no checkpoint in flight, and of those that ran while
//             one was written (they share the cores with its thread)
//
// One rank (a whole checkpoint: rank 0 writes model.pt and optimizer.pt) and, where mpirun is
// found, two ranks with the optimizer state sharded (each rank writes its slices). It checks what
// it measures: the async run's last checkpoint holds the waiting run's model, bit for bit, or it
// exits 1.
//
//   bench_async_checkpoint --binary build/launcher/hybrid_train [--reps 2] [--scratch DIR] [--quick]
//
// --scratch is where the checkpoints are written: put it on the disk a user would checkpoint to.
#include "bench/bench_util.h"
#include "training/checkpoint.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

// An MLP of about 29 M parameters under AdamW: 110 MiB of parameters and 330 MiB of state with
// the moments (--quick: 1.3 M parameters).
std::string job_text(bool quick) {
  return std::string(R"([model]
name = "mlp"
hidden = )") + (quick ? "[256, 256]" : "[4096, 4096]") + R"(
[data]
dataset = "synthetic"
synthetic_samples = 4096
synthetic_eval_samples = 64
synthetic_shape = [3, 32, 32]
synthetic_classes = 10
[training]
global_batch_size = 32
optimizer = "adamw"
lr = 0.001
eval_batches = 1
[metrics]
log_interval = 1
)";
}

struct Run {
  bool ok = false;
  double wall_s = 0;
  std::vector<double> blocked, write, publish, waited;
  double quiet_ms = 0, writing_ms = 0;  // median steps: none in flight, one in flight
  int64_t host_bytes = 0;
  std::string last_checkpoint;
};

Run read_run(const std::string& out, bool async) {
  Run r;
  std::vector<double> quiet, writing;
  std::vector<std::pair<int64_t, int64_t>> in_flight;  // (step taken, published after): steps between ran beside it
  std::vector<std::pair<int64_t, double>> steps;
  std::ifstream in(out + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    using ht::bench::json_number;
    if (line.find("\"event\": \"checkpoint\"") != std::string::npos) {
      r.blocked.push_back(json_number(line, "blocked_s").value_or(0));
      const auto at = line.find("\"folder\": \"");
      if (at != std::string::npos) r.last_checkpoint = line.substr(at + 11, line.find('"', at + 11) - at - 11);
      if (!async) continue;
      r.write.push_back(json_number(line, "write_s").value_or(0));
      r.publish.push_back(json_number(line, "publish_s").value_or(0));
      r.waited.push_back(json_number(line, "waited_s").value_or(0));
      r.host_bytes = static_cast<int64_t>(json_number(line, "host_bytes").value_or(0));
      in_flight.emplace_back(static_cast<int64_t>(json_number(line, "step").value_or(0)),
                             static_cast<int64_t>(json_number(line, "published_after").value_or(0)));
    } else if (line.find("\"event\": \"train\"") != std::string::npos) {
      steps.emplace_back(static_cast<int64_t>(json_number(line, "step").value_or(0)), json_number(line, "step_ms").value_or(0));
    }
  }
  for (const auto& [step, ms] : steps) {
    if (step <= 2) continue;  // warm-up
    bool beside = false;
    for (const auto& [taken, published] : in_flight) beside = beside || (step > taken && step <= published);
    (beside ? writing : quiet).push_back(ms);
  }
  r.quiet_ms = ht::bench::median(quiet);
  r.writing_ms = ht::bench::median(writing);
  r.ok = !r.blocked.empty();
  return r;
}

std::string seconds(const std::vector<double>& v) {
  if (v.empty()) return "-";
  char text[32];
  std::snprintf(text, sizeof text, "%.3f", ht::bench::median(v));
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"checkpoint.async against waiting checkpoints: the time a rank is blocked, the write, the publish, "
               "and the steps beside the write"};
  std::string binary, mpirun = "mpirun --allow-run-as-root --oversubscribe",
                      scratch = (fs::temp_directory_path() / "ht_async_checkpoint").string();
  int reps = 2, steps = 16, interval = 4;
  bool quick = false;
  app.add_option("--binary", binary, "the hybrid_train to run")->required();
  app.add_option("--scratch", scratch, "where the runs and their checkpoints are written")->capture_default_str();
  app.add_option("--mpirun", mpirun, "the launcher of the two-rank case (empty: one rank only)")->capture_default_str();
  app.add_option("--reps", reps, "runs of each mode")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--steps", steps, "steps a run")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--interval", interval, "checkpoint.interval")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_flag("--quick", quick, "a small model, one run each (the smoke run: the check, no claim)");
  CLI11_PARSE(app, argc, argv);
  if (quick) reps = 1;
  if (!mpirun.empty() && std::system((mpirun + " --version > /dev/null 2>&1").c_str()) != 0) mpirun.clear();
  fs::remove_all(scratch);
  fs::create_directories(scratch);
  const std::string config = scratch + "/job.toml";
  std::ofstream(config) << job_text(quick);

  std::printf("checkpoint.async against waiting checkpoints: %d steps, a checkpoint every %d, %d run(s) of each mode, "
              "checkpoints under %s; seconds are medians over the checkpoints\n\n", steps, interval, reps, scratch.c_str());
  std::printf("| %-26s | %-7s | %9s | %10s | %8s | %9s | %8s | %13s | %15s | %7s |\n", "ranks, layout", "mode",
              "host MiB", "blocked s", "write s", "publish s", "waited s", "step ms quiet", "step ms writing", "wall s");
  std::printf("|%s|\n", std::string(140, '-').c_str());
  bool failed = false;
  struct Case {
    int ranks;
    const char* name;
    const char* extra;
  };
  std::vector<Case> cases{{1, "1, whole (rank 0 writes)", ""}};
  if (!mpirun.empty()) cases.push_back({2, "2, sharded (slices)", " --parallel.shard=optimizer"});
  for (const Case& c : cases) {
    std::vector<Run> runs[2];
    for (int rep = 0; rep < reps && !failed; ++rep) {
      for (int async = 0; async < 2; ++async) {  // alternating: a slow spell of the machine hits both
        const std::string out = scratch + "/" + std::to_string(c.ranks) + (async ? "_async_" : "_sync_") + std::to_string(rep);
        const std::string command = (c.ranks > 1 ? mpirun + " -np " + std::to_string(c.ranks) + " " : std::string()) +
                                    binary + " " + config + c.extra + " --training.steps=" + std::to_string(steps) +
                                    " --checkpoint.interval=" + std::to_string(interval) + " --checkpoint.keep=2" +
                                    " --checkpoint.async=" + (async ? "true" : "false") + " --job.output_dir=" + out +
                                    " > " + out + ".log 2>&1";
        const auto start = std::chrono::steady_clock::now();
        const int status = std::system(command.c_str());
        Run r = read_run(out, async != 0);
        r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (status != 0 || !r.ok) {
          std::fprintf(stderr, "bench_async_checkpoint: %s failed (exit %d); its output: %s.log\n", command.c_str(),
                       status, out.c_str());
          failed = true;
          break;
        }
        runs[async].push_back(r);
      }
    }
    if (failed) break;
    for (int async = 0; async < 2; ++async) {
      std::vector<double> blocked, write, publish, waited, quiet, writing, wall;
      for (const Run& r : runs[async]) {
        blocked.insert(blocked.end(), r.blocked.begin(), r.blocked.end());
        write.insert(write.end(), r.write.begin(), r.write.end());
        publish.insert(publish.end(), r.publish.begin(), r.publish.end());
        waited.insert(waited.end(), r.waited.begin(), r.waited.end());
        quiet.push_back(r.quiet_ms);
        if (r.writing_ms > 0) writing.push_back(r.writing_ms);
        wall.push_back(r.wall_s);
      }
      const std::string host = async ? std::to_string(runs[async].front().host_bytes >> 20) : "-";
      char writing_text[32] = "-";
      if (!writing.empty()) std::snprintf(writing_text, sizeof writing_text, "%.1f", ht::bench::median(writing));
      std::printf("| %-26s | %-7s | %9s | %10s | %8s | %9s | %8s | %13.1f | %15s | %7.1f |\n", c.name,
                  async ? "async" : "waiting", host.c_str(), seconds(blocked).c_str(), seconds(write).c_str(),
                  seconds(publish).c_str(), seconds(waited).c_str(), ht::bench::median(quiet),
                  writing_text,
                  ht::bench::median(wall));
    }
    // The check: the last checkpoints hold the same model (whole: model.pt's bytes; slices: each
    // rank's files' bytes).
    const std::string a = runs[1].back().last_checkpoint, w = runs[0].back().last_checkpoint;
    if (!ht::CheckpointStore::verify(a).empty()) {
      std::fprintf(stderr, "bench_async_checkpoint: %s does not verify: %s\n", a.c_str(), ht::CheckpointStore::verify(a).c_str());
      failed = true;
    }
    for (const auto& entry : fs::directory_iterator(w)) {
      const std::string name = entry.path().filename().string();
      // optimizer.pt's archive keys are the parameters' addresses: not the same bytes twice (nor
      // the MANIFEST's CRC of it).
      if (name == "optimizer.pt" || (name == "MANIFEST" && fs::exists(w + "/optimizer.pt"))) continue;
      if (ht::bench::read_all(entry.path().string()) != ht::bench::read_all(a + "/" + name)) {
        std::fprintf(stderr, "bench_async_checkpoint: %s/%s differs from the waiting run's %s\n", a.c_str(), name.c_str(),
                     entry.path().c_str());
        failed = true;
      }
    }
  }
  if (!failed) std::printf("\ncheck: each async run's last checkpoint verifies and holds the waiting run's model, bit for bit\n");
  fs::remove_all(scratch);
  return failed ? 1 : 0;
}

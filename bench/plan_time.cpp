// How long `hybrid_train plan` takes to plan a model at scale, traced rather than run: the
// command a user types, timed end to end as a child process (the trace on meta tensors, the
// search over every layout, the report and the files it writes), a few times each, the median
// beside the target it is held to. Issue 63 set Llama 3 70B on 64 H100s (8 nodes of 8) at 10 s on
// this 2-core machine class (it took 40.4 s idle on 2026-12-01).
//
//   bench_plan_time --binary build/launcher/hybrid_train [--reps 3] [--quick]
//
// --quick: the 70B case once (the ctest smoke run, which prints the time and asserts nothing).
#include "bench/bench_util.h"

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

struct Case {
  const char* name;
  const char* config;   // relative to the source tree
  const char* cluster;  // --cluster KIND:NODESxDEVICES
  double target_s;      // what it is held to (0: none)
};

const std::vector<Case> kCases{
    {"Llama 3 70B, 64 H100s", "configs/llama3_70b.toml", "h100-sxm:8x8", 10.0},
    {"Llama 3 8B, 8 H100s", "configs/llama3_8b.toml", "h100-sxm:1x8", 0.0},
};

// The line of `plan`'s output that says what it chose, or "".
std::string chosen_line(const std::string& log) {
  std::ifstream in(log);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("chosen:", 0) == 0) return line.substr(0, 100) + (line.size() > 100 ? "..." : "");
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Wall time of hybrid_train plan at scale (traced on meta tensors), against its target"};
  std::string binary, source = HT_SOURCE_DIR, scratch = (std::filesystem::temp_directory_path() / "ht_plan_time").string();
  int reps = 3;
  bool quick = false;
  app.add_option("--binary", binary, "the hybrid_train to time")->required();
  app.add_option("--source", source, "the source tree whose configs/ it plans")->capture_default_str();
  app.add_option("--scratch", scratch, "where the plans are written")->capture_default_str();
  app.add_option("--reps", reps, "runs of each case")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_flag("--quick", quick, "the 70B case once (the smoke run)");
  CLI11_PARSE(app, argc, argv);
  if (quick) reps = 1;
  std::printf("hybrid_train plan, wall time of the whole command (trace, search, report, files), %d run(s) each:\n\n",
              reps);
  std::printf("| %-24s | %-13s | %8s | %8s | %8s | %8s | %s\n", "model", "cluster", "median s", "min s", "max s",
              "target s", "chosen");
  std::printf("|%s|\n", std::string(100, '-').c_str());
  bool failed = false;
  for (const Case& c : kCases) {
    if (quick && c.target_s == 0) continue;
    std::vector<double> seconds;
    const std::string out = scratch + "/" + std::to_string(&c - kCases.data());
    const std::string log = out + ".log";
    std::filesystem::create_directories(out);
    for (int r = 0; r < reps; ++r) {
      const std::string command = binary + " plan " + source + "/" + c.config + " --cluster " + c.cluster +
                                  " --job.output_dir=" + out + " > " + log + " 2>&1";
      const auto start = std::chrono::steady_clock::now();
      const int status = std::system(command.c_str());
      seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      if (status != 0) {
        std::fprintf(stderr, "bench_plan_time: %s failed (exit %d); its output: %s\n", command.c_str(), status,
                     log.c_str());
        failed = true;
        break;
      }
    }
    if (failed) break;
    const double median = ht::bench::median(seconds);
    const double lo = *std::min_element(seconds.begin(), seconds.end());
    const double hi = *std::max_element(seconds.begin(), seconds.end());
    const std::string target = c.target_s > 0 ? std::to_string(c.target_s).substr(0, 4) : "-";
    std::printf("| %-24s | %-13s | %8.1f | %8.1f | %8.1f | %8s | %s\n", c.name, c.cluster, median, lo, hi,
                target.c_str(), chosen_line(log).c_str());
  }
  std::filesystem::remove_all(scratch);
  return failed ? 1 : 0;
}

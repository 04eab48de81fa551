#pragma once
// What the benchmark programs' main()s share: the side-by-side options (measured and warm-up steps
// per side, the compute threads), the threads set as asked, and the process grid of a benchmark
// that runs under mpirun.

#include "parallel/process_grid.h"
#include "runtime/thread_pools.h"

#include <CLI/CLI.hpp>

#include <cstdio>
#include <optional>

namespace ht::bench {

struct StepOptions {
  int reps = 5;     // measured steps (or rounds) per side, interleaved
  int warmup = 1;   // unmeasured ones first
  int threads = 1;  // compute threads (ATen, oneDNN and OpenBLAS alike); 0: the machine's default
};

// --reps, --warmup and --threads, into `o` (whose values are the defaults).
inline void add_step_options(CLI::App& app, StepOptions& o) {
  app.add_option("--reps", o.reps, "measured steps per side (interleaved)")->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--warmup", o.warmup, "unmeasured steps per side first")->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--threads", o.threads, "compute threads: ATen, oneDNN and OpenBLAS (0: all hardware threads)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
}

// Every compute pool at `threads` (0: what one process alone would take here); the pools, for the
// table's header line.
inline ThreadPools use_threads(int threads) {
  return set_compute_threads(threads > 0 ? threads : default_thread_count(1));
}

// The grid of a benchmark of ranks, or, started without mpirun's 2 or more ranks, nothing after
// saying how to start it (the program then exits 2).
inline std::optional<ProcessGrid> grid_of_ranks(const char* program, const char* path) {
  ProcessGrid grid = make_process_grid();
  if (grid.world >= 2) return grid;
  std::fprintf(stderr, "%s: run it under mpirun with 2 or more ranks, e.g. mpirun --allow-run-as-root --oversubscribe "
               "-np 2 %s\n", program, path);
  finalize_process_grid();
  return std::nullopt;
}

}  // namespace ht::bench

// Data parallelism on this machine, under mpirun -np N (N >= 2), in one invocation:
// 1. all-reduce of the communicator (MPI) against message size: time (median), algorithm
//    bandwidth (bytes / time) and bus bandwidth as nccl-tests defines it (algbw x 2(N-1)/N);
// 2. weak scaling: each workload's training step at the same per-rank batch, rank 0 alone (the
//    other ranks wait) against all N ranks averaging gradients, interleaved (A B, B A, ...):
//    efficiency = t1 / tN, with gradients averaged after backward and with buckets started during
//    it (parallel.overlap); the share of tN (after) spent in all-reduce, and the share of the
//    all-reduce time hidden under backward (overlap, DataParallelStats::overlap).
#include "bench/bench_main.h"
#include "bench/budget_runner.h"
#include "parallel/data_parallel.h"
#include "parallel/process_grid.h"
#include "runtime/thread_pools.h"

#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <torch/optim/sgd.h>

namespace ht::bench {
namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void allreduce_table(Communicator& c, int reps) {
  const int n = c.size();
  if (c.rank() == 0) {
    std::printf("\nall-reduce (sum, float32) over %d ranks, %s, median of %d:\n\n", n, c.backend().c_str(), reps);
    std::printf("| %10s | %10s | %12s | %12s |\n", "bytes", "time us", "algbw MB/s", "busbw MB/s");
    std::printf("|%s|\n", std::string(55, '-').c_str());
  }
  for (int64_t bytes = 4 << 10; bytes <= (64 << 20); bytes *= 4) {
    at::Tensor t = at::ones({bytes / 4});
    c.allreduce_sum(t, "a benchmark tensor");  // warm-up
    std::vector<double> us;
    for (int i = 0; i < reps; ++i) {
      c.barrier("the benchmark");
      const double start = now_ms();
      c.allreduce_sum(t, "a benchmark tensor");
      us.push_back((now_ms() - start) * 1e3);
    }
    // Every rank's median; the slowest decides.
    at::Tensor m = at::full({1}, median(us), at::kDouble);
    c.allreduce_sum(m, "the timings");  // the mean of the medians
    const double time_us = m.item<double>() / n;
    const double algbw = static_cast<double>(bytes) / time_us;  // bytes per us = MB/s
    if (c.rank() == 0) {
      std::printf("| %10lld | %10.1f | %12.1f | %12.1f |\n", static_cast<long long>(bytes), time_us, algbw,
                  algbw * 2.0 * (n - 1) / n);
    }
  }
}

// How a step averages gradients: not at all (one rank alone), after backward, or in buckets
// started during backward.
enum class Averaging { kNone, kAfter, kDuring };

// One replica: the workload's model, SGD, and the gradient averaging of a group, both ways, over
// one gradient buffer laid out in reduction order (as the trainer does).
struct Replica {
  Replica(const Workload& w, const std::shared_ptr<Communicator>& group)
      : model(w.make()), sgd(model->parameters(), torch::optim::SGDOptions(1e-3).momentum(0.9)),
        after(group, model->parameters(), int64_t{25} << 20, false),
        during(group, model->parameters(), int64_t{25} << 20, true),
        gradients(after.reduction_order()) {
    after.use_gradient_buffer(&gradients);
    during.use_gradient_buffer(&gradients);
    std::tie(input, target) = w.data(w.batch);
    model->train();
  }
  // Returns the step's time and the averaging's statistics.
  std::pair<double, DataParallelStats> step(Averaging averaging) {
    Interpreter interp(InterpreterOptions{ExecutionMode::kInterpreted, 1});
    interp.set_gradient_buffer(&gradients);
    const double start = now_ms();
    Tensor loss = model->loss(model->forward(interp.input(input)), interp.input(target));
    if (averaging == Averaging::kDuring) interp.set_gradient_listener(&during);
    interp.backward(loss);
    DataParallelStats stats;
    if (averaging != Averaging::kNone) {
      DataParallel& dp = averaging == Averaging::kDuring ? during : after;
      dp.average_gradients();
      stats = dp.stats();
    }
    sgd.step();
    for (at::Tensor& p : model->parameters()) p.mutable_grad() = at::Tensor();
    return {now_ms() - start, stats};
  }
  std::shared_ptr<Model> model;
  torch::optim::SGD sgd;
  DataParallel after, during;
  GradientBuffer gradients;
  at::Tensor input, target;
};

void weak_scaling(const Workload& w, const std::shared_ptr<Communicator>& group, int warmup, int reps) {
  Communicator& c = *group;
  at::manual_seed(0);  // the same initial model and batch on every rank
  Replica replica(w, group);
  const Averaging modes[] = {Averaging::kNone, Averaging::kAfter, Averaging::kDuring};
  std::vector<double> ms[3], comm_share, overlap;
  for (int i = 0; i < warmup + reps; ++i) {
    for (int j = 0; j < 3; ++j) {
      const int mode = (i + j) % 3;  // each mode first, second and third in turn
      c.barrier("the benchmark");
      if (modes[mode] == Averaging::kNone) {
        if (c.rank() == 0) {
          const double t = replica.step(Averaging::kNone).first;
          if (i >= warmup) ms[mode].push_back(t);
        }
        continue;  // the other ranks wait at the next barrier
      }
      const auto [t, stats] = replica.step(modes[mode]);
      if (i < warmup || c.rank() != 0) continue;
      ms[mode].push_back(t);
      if (modes[mode] == Averaging::kAfter) comm_share.push_back(stats.comm_ms / t);
      if (modes[mode] == Averaging::kDuring) overlap.push_back(stats.overlap);
    }
  }
  if (c.rank() != 0) return;
  const double t1 = median(ms[0]), after = median(ms[1]), during = median(ms[2]);
  std::printf("| %-24s | %5lld | %7.1f | %7.1f | %7.1f | %10.3f | %10.3f | %9.1f%% | %7.2f |\n", w.name.c_str(),
              static_cast<long long>(w.batch), t1, after, during, t1 / after, t1 / during, 100 * median(comm_share),
              median(overlap));
  std::fflush(stdout);
}

}  // namespace
}  // namespace ht::bench

int main(int argc, char** argv) {
  CLI::App app{"Data parallelism: all-reduce bandwidth and weak scaling (run under mpirun -np N)"};
  ht::bench::StepOptions steps;
  bool quick = false;
  ht::bench::add_step_options(app, steps);
  app.add_flag("--quick", quick, "scaled-down workloads, for a smoke run");
  CLI11_PARSE(app, argc, argv);
  const std::optional<ht::ProcessGrid> ranks = ht::bench::grid_of_ranks("bench_data_parallel", argv[0]);
  if (!ranks) return 2;
  const ht::ProcessGrid& grid = *ranks;
  const int reps = steps.reps, warmup = steps.warmup;
  const ht::ThreadPools pools = ht::bench::use_threads(steps.threads);
  ht::bench::allreduce_table(*grid.data_parallel_group, quick ? 3 : 20);
  if (grid.is_root()) {
    std::printf("\nweak scaling: the same per-rank batch, rank 0 alone (t1) vs %d ranks averaging gradients after "
                "backward (tN after) or in buckets started during it (tN during), threads per rank %s, "
                "median of %d interleaved rounds:\n\n", grid.world, pools.describe().c_str(), reps);
    std::printf("| %-24s | %5s | %7s | %7s | %7s | %10s | %10s | %10s | %7s |\n", "model", "batch", "t1 ms", "after",
                "during", "eff. after", "eff. during", "all-reduce", "overlap");
    std::printf("|%s|\n", std::string(114, '-').c_str());
  }
  for (const auto& w : ht::bench::workloads(quick)) ht::bench::weak_scaling(w, grid.data_parallel_group, warmup, reps);
  ht::finalize_process_grid();
  return 0;
}

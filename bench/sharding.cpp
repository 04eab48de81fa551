// Sharded data parallelism (parallel.shard) on this machine, under mpirun -np N (N >= 2), in one
// invocation:
// 1. the collectives sharding uses beside all-reduce: reduce-scatter and all-gather of the
//    communicator (MPI) against message size, nccl-tests style: time (median), algorithm
//    bandwidth (bytes / time) and bus bandwidth (all-reduce x 2(N-1)/N, the other two x (N-1)/N);
// 2. model state per rank at each level built (none, optimizer) on a GPT-2-small-shaped decoder
//    (12 layers, d 768, vocabulary 50257) and ResNet-18, with AdamW: the fullest rank's bytes of
//    parameters, gradients and optimizer state, measured (the tensors' bytes), against the
//    planner's terms (planner/shard_terms.h) and ZeRO's formula for fp32 (4P + 4P + 8P/N). Exits
//    1 when a measured state differs from the planner's by a byte;
// 3. the step at the same per-rank batch, sharded against unsharded, interleaved (A B, B A, ...):
//    the time ratio and the all-gather's share of the sharded step;
// 4. the same for ZeRO-2 (gradients; with its reduce-scatters waited for where backward starts
//    them, and overlapped with backward on a worker thread, parallel.overlap's default, with the
//    share of their time hidden) and ZeRO-3 (parameters: a second replica whose parameters
//    live as shards, gathered a block at a time where they are read, as the trainer runs them),
//    ZeRO-3 twice: gathering where read, and prefetching one block ahead on the communication
//    thread (parallel.prefetch = 1, the default), with the share of the gathers' time hidden
//    under compute (1 - time the computing thread waited / time in the gathers).
#include "bench/bench_main.h"
#include "bench/bench_util.h"
#include "training/compact.h"
#include "training/optimizer.h"
#include "training/optimizer_shard.h"
#include "models/decoder.h"
#include "models/resnet.h"
#include "parallel/collective_worker.h"
#include "parallel/data_parallel.h"
#include "parallel/gradient_shards.h"
#include "parallel/parameter_shards.h"
#include "parallel/process_grid.h"
#include "planner/shard_terms.h"
#include "runtime/interpreter.h"
#include "runtime/thread_pools.h"

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <functional>
#include <tuple>

namespace ht::bench {
namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Every rank's median, averaged (the table's one number per size).
double mean_of_medians(Communicator& c, std::vector<double> us) {
  at::Tensor m = at::full({1}, median(std::move(us)), at::kDouble);
  c.allreduce_sum(m, "the timings");
  return m.item<double>() / c.size();
}

void collectives_table(Communicator& c, int reps, bool quick) {
  const int n = c.size();
  if (c.rank() == 0) {
    std::printf("\ncollectives (float32) over %d ranks, %s, median of %d; bus bandwidth as nccl-tests: all-reduce "
                "x 2(N-1)/N, reduce-scatter and all-gather x (N-1)/N:\n\n", n, c.backend().c_str(), reps);
    std::printf("| %10s | %-14s | %10s | %12s | %12s |\n", "bytes", "collective", "time us", "algbw MB/s", "busbw MB/s");
    std::printf("|%s|\n", std::string(72, '-').c_str());
  }
  for (int64_t bytes = 64 << 10; bytes <= (quick ? (1 << 20) : (64 << 20)); bytes *= 16) {
    const int64_t elements = bytes / 4;
    const std::vector<int64_t> counts = even_counts(elements, n);
    at::Tensor full = at::ones({elements}), shard = at::ones({counts[static_cast<size_t>(c.rank())]});
    const std::pair<const char*, std::function<void()>> ops[] = {
        {"all-reduce", [&] { c.allreduce_sum(full, "a benchmark tensor"); }},
        {"reduce-scatter", [&] { c.reduce_scatter_sum(full, shard, counts, "a benchmark tensor"); }},
        {"all-gather", [&] { c.all_gather(shard, full, counts, "a benchmark tensor"); }}};
    for (const auto& [name, op] : ops) {
      op();  // warm-up
      std::vector<double> us;
      for (int i = 0; i < reps; ++i) {
        c.barrier("the benchmark");
        const double start = now_ms();
        op();
        us.push_back((now_ms() - start) * 1e3);
      }
      const double time_us = mean_of_medians(c, us);
      const double algbw = static_cast<double>(bytes) / time_us;  // bytes per us = MB/s
      const double factor = std::string(name) == "all-reduce" ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n;
      if (c.rank() == 0) {
        std::printf("| %10lld | %-14s | %10.1f | %12.1f | %12.1f |\n", static_cast<long long>(bytes), name, time_us,
                    algbw, algbw * factor);
      }
    }
  }
}

struct BenchModel {
  std::string name;
  int64_t batch;
  std::function<std::shared_ptr<Model>()> make;
  std::function<std::pair<at::Tensor, at::Tensor>(int64_t)> data;
};

std::vector<BenchModel> models(bool quick) {
  std::vector<BenchModel> out;
  {
    const int64_t layers = quick ? 2 : 12, d = quick ? 64 : 768, t = quick ? 32 : 128, vocab = quick ? 256 : 50257;
    out.push_back({"gpt2-small-shaped T" + std::to_string(t) + " b1" + (quick ? " (quick)" : ""), 1,
                   [=] { return std::make_shared<Decoder>(DecoderOptions::gpt2(vocab, t, layers, quick ? 4 : 12, d, 0.0)); },
                   [=](int64_t b) {
                     return std::make_pair(at::randint(vocab, {b, t}, at::kLong), at::randint(vocab, {b, t}, at::kLong));
                   }});
  }
  {
    const int64_t width = quick ? 16 : 64;
    out.push_back({"resnet18 32x32 b8" + std::string(quick ? " (quick)" : ""), 8,
                   [=] { return std::make_shared<ResNet>(ResNetOptions{18, width, {}, 3, 10, true}); },
                   [](int64_t b) { return std::make_pair(at::randn({b, 3, 32, 32}), at::randint(10, {b}, at::kLong)); }});
  }
  return out;
}

// One replica as the trainer sets it up for sharding: the parameters in one block in reduction
// order, the gradient block likewise, and both an unsharded AdamW and this rank's sharded one.
struct Replica {
  Replica(const BenchModel& m, const std::shared_ptr<Communicator>& group)
      : model(m.make()), params(model->parameters()),
        replicas(group, params, int64_t{25} << 20, /*overlap=*/group->allows_worker_thread()) {
    std::vector<at::Tensor> order = replicas.reduction_order();
    const std::vector<at::Tensor> host = copies_on_host(order);
    const std::vector<at::Tensor> placed = into_one_block(host, at::kCPU);
    for (size_t i = 0; i < order.size(); ++i) order[i].set_data(placed[i]);
    gradients = std::make_unique<GradientBuffer>(order);
    replicas.use_gradient_buffer(gradients.get());
    shard = std::make_unique<OptimizerShard>(group, params, replicas.buckets(), gradients.get());
    grad_shards = std::make_unique<GradientShards>(group, params, replicas.buckets());
    if (group->allows_worker_thread()) {  // ZeRO-2 as the trainer runs it with parallel.overlap
      worker = std::make_shared<CollectiveWorker>(group);
      overlapped = std::make_unique<GradientShards>(group, params, replicas.buckets());
      overlapped->set_worker(worker);
      overlapped->set_overlap(true);
    }
    OptimizerOptions t;
    t.kind = OptimizerKind::kAdamw;
    t.lr = 1e-4;
    whole = make_optimizer(t, params);
    sharded = make_optimizer(t, shard->pieces());
    std::tie(input, target) = m.data(m.batch);
    model->train();
  }
  // One training step at `level` (0 none, 1 optimizer, 2 gradients, 5 gradients with the
  // reduce-scatters overlapped, as the trainer runs each); returns its time (and the all-gather's,
  // sharded; at 5, the share of the reduce-scatters' time hidden under backward).
  std::pair<double, double> step(int level) {
    const bool sharding = level > 0;
    GradientShards* zero2 = level == 2 ? grad_shards.get() : level == 5 ? overlapped.get() : nullptr;
    if (level == 5 && zero2 == nullptr) return {0, 0};
    Interpreter interp(InterpreterOptions{ExecutionMode::kInterpreted, 1});
    interp.set_gradient_buffer(zero2 != nullptr ? static_cast<const GradientSlots*>(zero2) : gradients.get());
    const double start = now_ms();
    Tensor loss = model->loss(model->forward(interp.input(input)), interp.input(target));
    if (zero2 != nullptr) {
      interp.set_gradient_listener(zero2);
    } else if (replicas.overlaps()) {
      interp.set_gradient_listener(&replicas);
    }
    interp.backward(loss);
    interp.set_gradient_listener(nullptr);
    if (zero2 != nullptr) {
      zero2->backward_ended();
      zero2->finish_step();
    } else {
      replicas.average_gradients();
    }
    double gather_ms = 0;
    if (zero2 != nullptr) {
      shard->attach_gradients(*zero2);
      sharded->step();
      shard->detach_gradients();
      shard->gather_parameters();
      gather_ms = level == 5 ? zero2->stats().overlap : shard->stats().gather_ms;
    } else if (sharding) {
      shard->attach_gradients();
      sharded->step();
      shard->detach_gradients();
      shard->gather_parameters();
      gather_ms = shard->stats().gather_ms;
    } else {
      whole->step();
    }
    clear_grads(params);
    return {now_ms() - start, gather_ms};
  }
  int64_t state_bytes(bool sharding) {
    int64_t bytes = 0;
    torch::optim::Optimizer& opt = sharding ? *sharded : *whole;
    for (const at::Tensor& p : sharding ? shard->pieces() : params)
      for (const at::Tensor& s : optimizer_state(opt, p))
        if (s.dim() > 0) bytes += static_cast<int64_t>(s.nbytes());
    return bytes;
  }
  std::shared_ptr<Model> model;
  std::vector<at::Tensor> params;
  DataParallel replicas;
  std::unique_ptr<GradientBuffer> gradients;
  std::unique_ptr<OptimizerShard> shard;
  std::unique_ptr<GradientShards> grad_shards;
  std::shared_ptr<CollectiveWorker> worker;
  std::unique_ptr<GradientShards> overlapped;  // null where MPI takes no second thread
  std::unique_ptr<torch::optim::Optimizer> whole, sharded;
  at::Tensor input, target;
};

// A replica whose parameters are sharded (ZeRO-3), set up as the trainer sets it up: buckets cut
// at blocks, each rank's share of each, gradients reduce-scattered, the optimizer over the shards.
struct ShardedReplica {
  ShardedReplica(const BenchModel& m, const std::shared_ptr<Communicator>& group, int prefetch)
      : model(m.make()), params(model->parameters()),
        replicas(group, params, int64_t{25} << 20, false, model->parameter_blocks()) {
    shards = std::make_unique<ParameterShards>(group, params, replicas.buckets(), at::Device(at::kCPU));
    if (prefetch > 0) {
      TORCH_CHECK(group->allows_worker_thread(), "bench_sharding: MPI without thread support cannot prefetch");
      worker = std::make_shared<CollectiveWorker>(group);
      shards->set_prefetch(worker, prefetch);
    }
    shards->set_block_uses(model->parameters_read_by_blocks());
    grad_shards = std::make_unique<GradientShards>(group, params, replicas.buckets());
    grad_shards->set_bucket_done([this](size_t b) { shards->bucket_done(b); });
    if (worker) {  // the trainer's way: the reduce-scatters beside backward on the prefetch worker
      grad_shards->set_worker(worker);
      grad_shards->set_overlap(true);
    }
    shard = std::make_unique<OptimizerShard>(group, params, replicas.buckets(), nullptr, &shards->shards());
    OptimizerOptions t;
    t.kind = OptimizerKind::kAdamw;
    t.lr = 1e-4;
    optimizer = make_optimizer(t, shard->pieces());
    std::tie(input, target) = m.data(m.batch);
    model->train();
  }
  // One step; returns its time, the all-gathers' share of it and the share of them hidden.
  std::tuple<double, double, double> step() {
    Interpreter interp(InterpreterOptions{ExecutionMode::kInterpreted, 1});
    interp.set_gradient_buffer(grad_shards.get());
    interp.set_parameter_source(shards.get());
    model->set_block_listener([&](int block) {
      interp.set_block(block);
      shards->block_begins(block);
    });
    const double start = now_ms();
    Tensor loss = model->loss(model->forward(interp.input(input)), interp.input(target));
    interp.set_gradient_listener(grad_shards.get());
    interp.backward(loss);
    interp.set_gradient_listener(nullptr);
    grad_shards->backward_ended();
    shards->release_all();
    grad_shards->finish_step();
    shard->attach_gradients(*grad_shards);
    optimizer->step();
    shard->detach_gradients();
    model->set_block_listener(nullptr);
    const double ms = now_ms() - start;
    const ParameterGatherStats g = shards->take_stats();
    return {ms, g.ms / ms, g.hidden()};
  }
  std::shared_ptr<Model> model;
  std::vector<at::Tensor> params;
  DataParallel replicas;
  std::shared_ptr<CollectiveWorker> worker;
  std::unique_ptr<ParameterShards> shards;
  std::unique_ptr<GradientShards> grad_shards;
  std::unique_ptr<OptimizerShard> shard;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  at::Tensor input, target;
};

// ZeRO-2's row of a model, printed after the ZeRO-1 table: rank 0's gradient shards and step.
struct Zero2Row {
  std::string name;
  int64_t parameters, gradient_shard_bytes;
  double ms, none_ms;
  double overlapped_ms = 0, hidden = 0;  // reduce-scatters overlapped with backward: the step, the share hidden
  int64_t shard_elements = 0;  // rank 0's
  bool exact = false;          // its shards' bytes are the planner's 4 x shard_elements
};
std::vector<Zero2Row> g_zero2;

// ZeRO-3's row: rank 0's parameter shards, its state, the step and the gathers' share of it.
struct Zero3Row {
  std::string name;
  int64_t parameters = 0, parameter_shard_bytes = 0, gradient_shard_bytes = 0, state_bytes = 0;
  bool exact = false;  // parameter and gradient shards are the planner's 4 x shard_elements(block buckets)
  double ms = 0, none_ms = 0, gather_share = 0;
  // Prefetching one block ahead: the step, the gathers' share of it, the share of them hidden, and
  // whether its shards are the inline replica's, bit for bit.
  double prefetch_ms = 0, prefetch_gather_share = 0, hidden = 0;
  bool same_bits = false;
};
std::vector<Zero3Row> g_zero3;

// Returns false when a measured state differs from the planner's.
bool measure(const BenchModel& m, const std::shared_ptr<Communicator>& group, int warmup, int reps) {
  Communicator& c = *group;
  at::manual_seed(0);  // the same model and batch on every rank
  Replica r(m, group);
  const int n = c.size();
  int64_t parameters = 0;
  for (const at::Tensor& p : r.params) parameters += p.numel();
  at::manual_seed(0);
  ShardedReplica r3(m, group, 0);  // the same initial model
  at::manual_seed(0);
  ShardedReplica r4(m, group, 1);
  std::vector<double> ms[6], gather_share, gather3_share, gather4_share, hidden4, hidden5;
  for (int i = 0; i < warmup + reps; ++i) {
    for (int j = 0; j < 6; ++j) {
      // The order rotates: none, optimizer, gradients, parameters, parameters prefetched,
      // gradients overlapped, ...
      const int level = (i + j) % 6;
      c.barrier("the benchmark");
      double t = 0, gather = 0, hidden = 0;
      if (level == 3) {
        std::tie(t, gather, hidden) = r3.step();
      } else if (level == 4) {
        std::tie(t, gather, hidden) = r4.step();
      } else {
        std::tie(t, gather) = r.step(level);
      }
      if (i < warmup) continue;
      ms[level].push_back(t);
      if (level == 1) gather_share.push_back(gather / t);
      if (level == 5) hidden5.push_back(gather);
      if (level == 3) gather3_share.push_back(gather);
      if (level == 4) {
        gather4_share.push_back(gather);
        hidden4.push_back(hidden);
      }
    }
  }
  {
    Zero3Row z{m.name, parameters, 0, r3.grad_shards->shard_bytes(), 0};
    for (const at::Tensor& s : r3.shards->shards()) z.parameter_shard_bytes += static_cast<int64_t>(s.nbytes());
    for (const at::Tensor& p : r3.shard->pieces())
      for (const at::Tensor& st : optimizer_state(*r3.optimizer, p))
        if (st.dim() > 0) z.state_bytes += static_cast<int64_t>(st.nbytes());
    const int64_t elements = shard_elements(r3.replicas.bucket_elements(), n);
    z.exact = z.parameter_shard_bytes == 4 * elements && z.gradient_shard_bytes == 4 * elements &&
              z.state_bytes == 8 * elements;
    z.ms = mean_of_medians(c, ms[3]);
    z.gather_share = mean_of_medians(c, gather3_share);
    z.prefetch_ms = mean_of_medians(c, ms[4]);
    z.prefetch_gather_share = mean_of_medians(c, gather4_share);
    z.hidden = mean_of_medians(c, hidden4);
    // The same steps from the same model: prefetching moves no bit (every rank's shards).
    bool same = r3.shards->shards().size() == r4.shards->shards().size();
    for (size_t b = 0; same && b < r3.shards->shards().size(); ++b)
      same = at::equal(r3.shards->shards()[b], r4.shards->shards()[b]);
    at::Tensor differs = at::full({1}, same ? 0.0 : 1.0, at::kDouble);
    c.allreduce_sum(differs, "the check");
    z.same_bits = differs.item<double>() == 0;
    g_zero3.push_back(z);
  }
  g_zero2.push_back(Zero2Row{m.name, parameters, r.grad_shards->shard_bytes(), mean_of_medians(c, ms[2]), 0});
  // The fullest rank's state (rank 0 owns the larger shares), every rank's for the check.
  const int64_t whole_state = r.state_bytes(false), shard_state = r.state_bytes(true);
  const int64_t predicted_shard = 8 * shard_elements(r.replicas.bucket_elements(), n);
  const int64_t predicted_here = 8 * r.shard->elements();  // this rank's share: the same rule
  at::Tensor wrong = at::full({1}, shard_state != predicted_here || whole_state != 8 * parameters ? 1.0 : 0.0, at::kDouble);
  c.allreduce_sum(wrong, "the check");
  const double t_none = mean_of_medians(c, ms[0]), t_shard = mean_of_medians(c, ms[1]);
  g_zero2.back().none_ms = t_none;
  g_zero2.back().overlapped_ms = mean_of_medians(c, ms[5]);
  g_zero2.back().hidden = mean_of_medians(c, hidden5);
  g_zero3.back().none_ms = t_none;
  g_zero2.back().shard_elements = r.shard->elements();
  g_zero2.back().exact = g_zero2.back().gradient_shard_bytes == 4 * shard_elements(r.replicas.bucket_elements(), n);
  const double share = mean_of_medians(c, gather_share);
  if (c.rank() != 0) return wrong.item<double>() == 0;
  const double mib = 1024.0 * 1024.0;
  const double formula = (4.0 * parameters + 4.0 * parameters + 8.0 * parameters / n) / mib;
  const double measured = (8.0 * parameters + static_cast<double>(shard_state)) / mib;
  std::printf("| %-34s | %11lld | %10.2f | %10.2f | %10.2f | %10.2f | %10.2f | %9s | %7.1f | %7.1f | %6.3fx | %7.1f%% |\n",
              m.name.c_str(), static_cast<long long>(parameters), 16.0 * parameters / mib, measured,
              static_cast<double>(predicted_shard + 8 * parameters) / mib, formula, static_cast<double>(shard_state) / mib,
              wrong.item<double>() == 0 && shard_state == predicted_shard ? "exact" : "DIFFERS", t_none, t_shard,
              t_shard / t_none, 100 * share);
  std::fflush(stdout);
  return wrong.item<double>() == 0 && shard_state == predicted_shard;
}

}  // namespace
}  // namespace ht::bench

int main(int argc, char** argv) {
  CLI::App app{"Sharded data parallelism: collectives, model state per rank, step time (run under mpirun -np N)"};
  ht::bench::StepOptions steps;
  bool quick = false;
  std::string only;
  app.add_option("--only", only,
                 "models whose name holds this text (e.g. resnet18: 8 oversubscribed ranks of the GPT-2 shape need "
                 "18 GB)");
  ht::bench::add_step_options(app, steps);
  app.add_flag("--quick", quick, "scaled-down models and messages, for a smoke run");
  CLI11_PARSE(app, argc, argv);
  const std::optional<ht::ProcessGrid> ranks = ht::bench::grid_of_ranks("bench_sharding", argv[0]);
  if (!ranks) return 2;
  const ht::ProcessGrid& grid = *ranks;
  const int reps = steps.reps, warmup = steps.warmup;
  const ht::ThreadPools pools = ht::bench::use_threads(steps.threads);
  ht::bench::collectives_table(*grid.data_parallel_group, quick ? 3 : 20, quick);
  if (grid.is_root()) {
    std::printf("\nmodel state per rank (parameters + gradients + AdamW state, MiB) and the step, %d ranks, parallel.shard "
                "= none vs optimizer, threads per rank %s, median of %d interleaved rounds:\n\n",
                grid.world, pools.describe().c_str(), reps);
    std::printf("| %-34s | %11s | %10s | %10s | %10s | %10s | %10s | %9s | %7s | %7s | %7s | %8s |\n", "model",
                "parameters", "none MiB", "optimizer", "predicted", "4P+4P+8P/N", "state", "vs plan", "none ms",
                "shard ms", "ratio", "gather");
    std::printf("|%s|\n", std::string(164, '-').c_str());
  }
  bool exact = true;
  for (const auto& m : ht::bench::models(quick)) {
    if (m.name.find(only) == std::string::npos) continue;
    exact = ht::bench::measure(m, grid.data_parallel_group, warmup, reps) && exact;
  }
  if (grid.is_root() && !ht::bench::g_zero2.empty()) {
    std::printf("\nparallel.shard = gradients (ZeRO-2) on the same replicas, in the same rounds: rank 0's gradient shards "
                "(one per bucket, the fullest rank) against 4P/N, its model state, and the step:\n\n");
    std::printf("| %-34s | %10s | %10s | %10s | %9s | %12s | %7s | %8s | %7s | %10s | %7s | %7s |\n", "model", "grads MiB",
                "shards", "4P/N", "vs plan", "state MiB", "none ms", "zero2 ms", "ratio", "overlapped", "ratio",
                "hidden");
    std::printf("|%s|\n", std::string(156, '-').c_str());
    const int n = grid.world;
    for (const auto& z : ht::bench::g_zero2) {
      const double mib = 1024.0 * 1024.0, p = static_cast<double>(z.parameters);
      const double shards = static_cast<double>(z.gradient_shard_bytes) / mib;
      std::printf("| %-34s | %10.2f | %10.2f | %10.2f | %9s | %12.2f | %7.1f | %8.1f | %6.3fx | %10.1f | %6.3fx | %6.1f%% |\n",
                  z.name.c_str(), 4.0 * p / mib, shards, 4.0 * p / n / mib, z.exact ? "exact" : "DIFFERS",
                  (4.0 * p + 8.0 * z.shard_elements) / mib + shards, z.none_ms, z.ms, z.ms / z.none_ms, z.overlapped_ms,
                  z.overlapped_ms / z.none_ms, 100 * z.hidden);
      exact = exact && z.exact;
    }
  }
  if (grid.is_root() && !ht::bench::g_zero3.empty()) {
    std::printf("\nparallel.shard = parameters (ZeRO-3) on replicas of their own (buckets cut at blocks), in the same "
                "rounds: rank 0's parameter, gradient and AdamW shards against 4P/N + 4P/N + 8P/N; the step gathering "
                "where read (prefetch 0) and prefetching a block ahead on the communication thread (prefetch 1), each "
                "against the unsharded step, the all-gathers' share of each, and the share of the prefetched gathers' "
                "time hidden under compute; `bits`: the prefetched replica's shards are the other's after every step:\n\n");
    std::printf("| %-34s | %10s | %10s | %10s | %9s | %7s | %8s | %7s | %8s | %8s | %7s | %8s | %7s | %5s |\n", "model",
                "none MiB", "state MiB", "16P/N", "vs plan", "none ms", "zero3 ms", "ratio", "gathers", "prefetch",
                "ratio", "gathers", "hidden", "bits");
    std::printf("|%s|\n", std::string(176, '-').c_str());
    const int n = grid.world;
    for (const auto& z : ht::bench::g_zero3) {
      const double mib = 1024.0 * 1024.0, p = static_cast<double>(z.parameters);
      std::printf("| %-34s | %10.2f | %10.2f | %10.2f | %9s | %7.1f | %8.1f | %6.3fx | %7.1f%% | %8.1f | %6.3fx | "
                  "%7.1f%% | %6.1f%% | %5s |\n",
                  z.name.c_str(), 16.0 * p / mib,
                  static_cast<double>(z.parameter_shard_bytes + z.gradient_shard_bytes + z.state_bytes) / mib,
                  16.0 * p / n / mib, z.exact ? "exact" : "DIFFERS", z.none_ms, z.ms, z.ms / z.none_ms,
                  100 * z.gather_share, z.prefetch_ms, z.prefetch_ms / z.none_ms, 100 * z.prefetch_gather_share,
                  100 * z.hidden, z.same_bits ? "same" : "DIFFER");
      exact = exact && z.exact && z.same_bits;
    }
  }
  ht::finalize_process_grid();
  if (!exact) {
    std::fprintf(stderr, "bench_sharding: a rank's measured state differs from the planner's terms, or prefetching "
                 "changed a bit\n");
    return 1;
  }
  return 0;
}

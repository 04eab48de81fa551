// Pipeline parallelism on this machine, in one invocation (hybrid_train runs as child processes,
// under mpirun for the pipelines):
// 1. each schedule on pp = 2 against one rank with the same global batch and micro-batches: step
//    time, throughput ratio, the step's parts per stage (compute, waiting = bubble + transfer),
//    the measured bubble share against the schedule's theory, the first stage's activation peak,
//    the bytes sent per step; and whether the final loss is the single rank's. 1F1B, interleaved and
//    ZB-H1 again with their messages carried as NCCL carries them (parallel.pipeline_p2p =
//    "nccl_like"), and beside each row's measured waiting the schedule played with that run's own
//    compute per stage and the planner's message time: by tag (simulate) or on serial streams
//    (simulate_on_serial_streams), what the planner prices.
// 2. the partition: stages balanced by modelled time against split by parameter count (what
//    torchtitan, DeepSpeed and Megatron do), the slowest stage over the mean, predicted for
//    pp = 2 and 4 and measured for pp = 2.
// Exits non-zero when a pipeline's loss is not the single rank's or a run fails.
#include "base/remove_tree.h"
#include "bench/bench_util.h"
#include "launcher/config/config_loader.h"
#include "launcher/data/dataset.h"
#include "launcher/model_factory.h"
#include "launcher/planning/job_plan.h"
#include "parallel/serial_streams.h"
#include "training/pipeline_setup.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <sys/wait.h>

#ifndef HT_MPIEXEC
#define HT_MPIEXEC "mpirun"
#endif

namespace ht::bench {
namespace {

// A job: its config file and the overrides every run of it takes.
struct Job {
  std::string name, config, args;
  std::vector<ConfigOverride> overrides;  // the same, for profiling it in this process
};

struct Options {
  std::string binary;
  std::string scratch = "/tmp/ht_bench_pipeline";
  int steps = 12, layers = 6, micro_batches = 8, reps = 3;
  bool quick = false;
};

std::vector<double> json_list(const std::string& line, const std::string& key) {
  const std::string k = "\"" + key + "\": [";
  const size_t at = line.find(k);
  std::vector<double> v;
  if (at == std::string::npos) return v;
  std::istringstream in(line.substr(at + k.size(), line.find(']', at) - at - k.size()));
  std::string item;
  while (std::getline(in, item, ',')) v.push_back(std::stod(item));
  return v;
}

struct Run {
  bool ok = false;
  std::string output;
  double step_ms = 0, loss = 0, activation_peak = 0, p2p_bytes = 0, bubble = 0;
  std::vector<double> compute_ms, wait_ms;  // per stage, medians over steps after warm-up
};

Job gpt_job(const Options& o) {
  const std::string layers = std::to_string(o.layers), micro = std::to_string(32 / o.micro_batches);
  return {"GPT (embedding, " + layers + " layers, head; its embedding's weight is its head's)",
          std::string(HT_SOURCE_DIR) + "/configs/gpt_tiny.toml",
          "--model.n_layer=" + layers + " --training.global_batch_size=32 --training.micro_batch_size=" + micro,
          {{"model.n_layer", layers, "--model.n_layer"}, {"training.global_batch_size", "32", "-"},
           {"training.micro_batch_size", micro, "-"}}};
}

// ResNet-18: its stem computes much with few parameters, its last stage the reverse.
Job resnet_job(const Options& o) {
  const std::string micro = std::to_string(32 / o.micro_batches);
  return {"ResNet-18 (width 16, Fashion-MNIST: stem, 8 residual blocks, head)",
          std::string(HT_SOURCE_DIR) + "/configs/resnet18_fmnist.toml",
          "--model.width=16 --training.global_batch_size=32 --training.micro_batch_size=" + micro,
          {{"model.width", "16", "-"}, {"training.global_batch_size", "32", "-"},
           {"training.micro_batch_size", micro, "-"}}};
}

Run train(const Options& o, const Job& job, int stages, const std::string& name, const std::string& extra,
          int threads = 1) {
  Run r;
  const std::string out = o.scratch + "/" + name;
  ht::remove_tree(out);
  std::string command = (stages > 1 ? std::string(HT_MPIEXEC) + " --allow-run-as-root --oversubscribe -np " +
                                          std::to_string(stages) + " " : std::string()) +
                        o.binary + " " + job.config + " " + job.args + " --job.output_dir=" + out +
                        " --training.steps=" + std::to_string(o.steps) + " --metrics.log_interval=1 " +
                        "--training.eval_interval=0 --training.eval_batches=1 --checkpoint.interval=0 " +
                        "--training.threads=" + std::to_string(threads) + " " + extra + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) r.output.append(buf, n);
  r.ok = pclose(pipe) == 0;
  std::ifstream in(out + "/metrics.jsonl");
  std::vector<double> step, bubble, p2p;
  std::vector<std::vector<double>> compute, wait;
  int seen = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"event\": \"train\"") == std::string::npos) continue;
    r.loss = json_number(line, "loss").value_or(0);
    r.activation_peak = std::max(r.activation_peak, json_number(line, "activation_peak_bytes").value_or(0));
    if (++seen <= 2) continue;  // warm-up: memory paged in, optimizer state built, ranks started
    step.push_back(json_number(line, "step_ms").value_or(0));
    const std::vector<double> c = json_list(line, "stage_compute_ms"), w = json_list(line, "stage_wait_ms");
    compute.resize(c.size());
    wait.resize(w.size());
    double share = 0;
    for (size_t s = 0; s < c.size(); ++s) {
      compute[s].push_back(c[s]);
      wait[s].push_back(w[s]);
      share += w[s] / std::max(1e-9, c[s] + w[s]) / static_cast<double>(c.size());
    }
    bubble.push_back(share);
    const std::vector<double> bytes = json_list(line, "stage_p2p_bytes");
    double sum = 0;
    for (double b : bytes) sum += b;
    p2p.push_back(sum);
  }
  if (step.empty()) return r;
  r.step_ms = median(step);
  if (!bubble.empty()) r.bubble = median(bubble);
  if (!p2p.empty()) r.p2p_bytes = median(p2p);
  for (auto& v : compute) r.compute_ms.push_back(median(v));
  for (auto& v : wait) r.wait_ms.push_back(median(v));
  return r;
}

std::string per_stage(const std::vector<double>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    char b[32];
    std::snprintf(b, sizeof b, "%s%.1f", i ? "/" : "", v[i]);
    s += b;
  }
  return s;
}

struct Row {
  const char* name;
  ScheduleKind kind;
  int v;
  std::string args;  // empty: one rank
  bool serial = false;  // parallel.pipeline_p2p = "nccl_like"
};

// The waiting per stage the schedule's play predicts for run `r`: each stage's actions at its own
// measured compute (a backward twice a forward, its halves alike), each message the planner's
// time for this machine at the run's bytes; by tag, or on serial streams with the posting a stage
// takes.
std::vector<double> played_wait_ms(const Row& row, const Run& r, int micro_batches, const Machine& machine) {
  const ScheduleShape shape{2, micro_batches, row.v};
  const PipelineSchedule schedule = make_schedule(row.kind, shape);
  double mean = 0, messages = 0;
  for (double c : r.compute_ms) mean += c / static_cast<double>(r.compute_ms.size());
  for (int rank = 0; rank < shape.stages; ++rank) {
    for (const Action& a : schedule[static_cast<size_t>(rank)]) messages += messages_of(a, rank, shape).send.size();
  }
  SimulationCosts costs;
  costs.forward = mean / (3.0 * micro_batches * row.v);
  costs.backward_input = costs.backward_weight = costs.forward;
  for (double c : r.compute_ms) costs.stage_scale.push_back(mean > 0 ? c / mean : 1);
  const double bytes = messages > 0 ? r.p2p_bytes / messages : 0;
  costs.p2p = machine.intra_node_latency_us * 1e-3 + bytes / (machine.intra_node_gbps * 1e9) * 1e3;
  const std::optional<Posting> posting = row.serial ? serial_posting(schedule, shape) : std::nullopt;
  const SimulationResult played =
      posting ? simulate_on_serial_streams(schedule, shape, *posting, costs) : simulate(schedule, shape, costs);
  std::vector<double> wait;
  for (double busy : played.busy) wait.push_back(played.makespan - busy);
  return wait;
}

// Each row `reps` times, the rows interleaved (A B C, A B C, ...) so that a slow minute of this
// shared machine hits every row alike; each row's run of median step time is reported.
std::vector<Run> run_rows(const Options& o, const Job& job, const std::vector<Row>& rows) {
  std::vector<std::vector<Run>> runs(rows.size());
  for (int rep = 0; rep < o.reps; ++rep) {
    for (size_t i = 0; i < rows.size(); ++i) {
      const bool piped = !rows[i].args.empty();
      std::string folder = rows[i].name + std::string("_") + std::to_string(rep);
      for (char& c : folder) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
      runs[i].push_back(train(o, job, piped ? 2 : 1, folder,
                              rows[i].args, piped ? 1 : (rows[i].v == 2 ? 2 : 1)));
    }
  }
  std::vector<Run> median_runs;
  for (auto& r : runs) {
    std::sort(r.begin(), r.end(), [](const Run& a, const Run& b) {
      return (a.ok ? a.step_ms : 1e300) < (b.ok ? b.step_ms : 1e300);
    });
    median_runs.push_back(r[r.size() / 2]);
  }
  return median_runs;
}

int schedules_table(const Options& o) {
  auto piped = [](const char* schedule, int v) {
    return std::string("--parallel.pipeline_parallel=2 --parallel.pipeline_schedule=") + schedule +
           " --parallel.virtual_stages=" + std::to_string(v);
  };
  const std::string nccl_like = " --parallel.pipeline_p2p=nccl_like";
  const std::vector<Row> rows = {
      {"one rank", ScheduleKind::k1f1b, 1, ""},  // one thread
      {"one rank, 2 threads", ScheduleKind::k1f1b, 2, ""},
      {"gpipe", ScheduleKind::kGpipe, 1, piped("gpipe", 1)},
      {"1f1b", ScheduleKind::k1f1b, 1, piped("1f1b", 1)},
      {"interleaved_1f1b", ScheduleKind::kInterleaved1f1b, 2, piped("interleaved_1f1b", 2)},
      {"zb_h1", ScheduleKind::kZbH1, 1, piped("zb_h1", 1)},
      {"1f1b, nccl_like", ScheduleKind::k1f1b, 1, piped("1f1b", 1) + nccl_like, true},
      {"interleaved_1f1b, nccl_like", ScheduleKind::kInterleaved1f1b, 2, piped("interleaved_1f1b", 2) + nccl_like, true},
      {"zb_h1, nccl_like", ScheduleKind::kZbH1, 1, piped("zb_h1", 1) + nccl_like, true}};
  const Job gpt = gpt_job(o);
  const std::vector<Run> runs = run_rows(o, gpt, rows);
  const Run &one = runs[0], &both = runs[1];
  if (!one.ok || !both.ok) {
    std::fprintf(stderr, "the single-rank run failed:\n%s\n", (one.ok ? both : one).output.c_str());
    return 1;
  }
  std::printf("\nGPT, %d layers, global batch 32 in %d micro-batches, %d steps (medians after 2; the run of median "
              "step time of %d), one thread a rank;\none rank: %.1f ms a step on one thread, %.1f ms on two (both "
              "cores), final loss %.6f\n\n", o.layers, o.micro_batches, o.steps, o.reps, one.step_ms, both.step_ms,
              one.loss);
  // The planner's message time on this machine: latency and the copy rate it measures.
  const Machine machine = machine_for(load_config(gpt.config, gpt.overrides).config, PlanArgs{}, 2);
  std::printf("| schedule (pp = 2) | step ms | vs one rank, 1 / 2 threads | compute ms/stage | waiting ms/stage |"
              " played | bubble | theory | measured/theory | stage 0 activations MiB | p2p MiB/step | loss = one rank's |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  int failures = 0;
  double gpipe_peak = 0;
  for (size_t i = 2; i < rows.size(); ++i) {
    const Row& row = rows[i];
    const Run& r = runs[i];
    if (!r.ok) {
      std::fprintf(stderr, "%s failed:\n%s\n", row.name, r.output.c_str());
      ++failures;
      continue;
    }
    const double theory = theoretical_bubble(row.kind, ScheduleShape{2, o.micro_batches, row.v});
    const bool same = std::fabs(r.loss - one.loss) <= 1e-4 * std::fabs(one.loss);  // tied weights: fp32 order
    failures += same ? 0 : 1;
    if (row.kind == ScheduleKind::kGpipe) gpipe_peak = r.activation_peak;
    const std::string versus = gpipe_peak > 0 && row.kind != ScheduleKind::kGpipe
                                   ? " (" + std::to_string(r.activation_peak / gpipe_peak).substr(0, 4) + "x gpipe's)"
                                   : "";
    std::printf("| %s | %.1f | %.2fx / %.2fx | %s | %s | %s | %.3f | %.3f | %.2f | %.2f%s | %.2f | %s |\n", row.name,
                r.step_ms, one.step_ms / r.step_ms, both.step_ms / r.step_ms, per_stage(r.compute_ms).c_str(),
                per_stage(r.wait_ms).c_str(), per_stage(played_wait_ms(row, r, o.micro_batches, machine)).c_str(),
                r.bubble, theory, r.bubble / theory, r.activation_peak / 1048576.0,
                versus.c_str(), r.p2p_bytes / 1048576.0, same ? "yes" : "NO");
  }
  std::printf("\nplayed: each stage's waiting when the schedule is played with the run's compute per stage, each "
              "message\n%.0f us plus its bytes at %.1f GB/s (the planner's for this machine); by tag, or on serial "
              "streams with the posting\na stage takes (nccl_like rows), as the planner prices them.\n",
              machine.intra_node_latency_us, machine.intra_node_gbps);
  std::printf("bubble: the stages' mean share of their step spent waiting for an activation or a gradient "
              "(bubble and transfer);\ntheory: (p-1)/(m+p-1), /v interleaved, (p-1)/(3m+p-1) zb_h1; 1F1B's first-stage "
              "activations should be at most p/m = %.2f of GPipe's.\n", 2.0 / o.micro_batches);
  return failures;
}

std::string counts_text(const std::vector<int>& counts) {
  std::string s = "[";
  for (size_t i = 0; i < counts.size(); ++i) s += (i ? "," : "") + std::to_string(counts[i]);
  return s + "]";
}

double imbalance(const std::vector<double>& ms) {
  double slowest = 0, sum = 0;
  for (double v : ms) {
    slowest = std::max(slowest, v);
    sum += v;
  }
  return ms.empty() ? 0 : slowest / (sum / static_cast<double>(ms.size()));
}

// The block times the trainer measured and printed ("block ms (...): embed 0.412 h0 1.203 ...").
std::vector<double> printed_block_ms(const std::string& output) {
  const size_t at = output.find("block ms (");
  std::vector<double> ms;
  if (at == std::string::npos) return ms;
  std::istringstream line(output.substr(output.find("):", at) + 2, output.find('\n', at) - output.find("):", at) - 2));
  std::string name;
  for (double v; line >> name >> v;) ms.push_back(v);
  return ms;
}

// Both splits of the job's blocks into 2 and 4 stages, by the block times the trainer measured
// (its own pp = 2 run's probe) and by parameter count; the pp = 2 ones trained and measured.
int partition_table(const Options& o, const Job& job) {
  LoadedConfig loaded = load_config(job.config, job.overrides);
  Config& config = loaded.config;
  const DataSplits data = make_datasets(config);
  at::manual_seed(config.job.seed);
  std::shared_ptr<Model> model = make_model(config, data.info);
  const std::string tag = job.config.substr(job.config.rfind('/') + 1);
  const Run balanced_run = train(o, job, 2, tag + "_time", "--parallel.pipeline_parallel=2");
  const std::vector<double> block_ms = printed_block_ms(balanced_run.output);
  if (!balanced_run.ok || block_ms.size() != model->blocks().size()) {
    std::fprintf(stderr, "%s: the pipeline run failed or printed no block times:\n%s\n", tag.c_str(),
                 balanced_run.output.c_str());
    return 1;
  }
  std::vector<BlockCost> costs(block_ms.size());
  for (size_t b = 0; b < costs.size(); ++b) {
    costs[b].name = model->block_names()[b];
    costs[b].forward_ms = block_ms[b];
    for (const at::Tensor& p : model->blocks()[b]->parameters()) costs[b].parameters += p.numel();
  }
  std::printf("\nthe partition of %s, %zu blocks: slowest stage / mean stage, predicted from the block times the "
              "trainer measured, and measured (compute ms per stage)\n\n", job.name.c_str(), costs.size());
  std::printf("| pp | split | blocks per stage | predicted | measured |\n");
  std::printf("|---|---|---|---|---|\n");
  int failures = 0;
  for (int pp : {2, 4}) {
    PartitionOptions options;
    options.stages = pp;
    options.in_flight = one_f_one_b_in_flight(pp, o.micro_batches);
    const Partition balanced = balance_stages(costs, options);
    const Partition by_params = partition_by_parameters(costs, options);
    for (const auto& [name, p] : {std::pair<const char*, const Partition*>{"block times", &balanced},
                                  {"parameter count", &by_params}}) {
      const std::vector<int> counts = stage_block_counts(*p);
      std::string measured = "(2 cores: pp = 2 only)";
      if (pp == 2) {
        const Run r = p == &balanced ? balanced_run
                                     : train(o, job, 2, tag + "_params", "--parallel.pipeline_parallel=2 "
                                             "--parallel.stage_blocks=" + counts_text(counts));
        failures += r.ok ? 0 : 1;
        char text[96];
        std::snprintf(text, sizeof text, "%.2f (%s)", imbalance(r.compute_ms), per_stage(r.compute_ms).c_str());
        measured = r.ok ? text : "failed";
      }
      std::printf("| %d | %s | %s | %.2f | %s |\n", pp, name, counts_text(counts).c_str(),
                  p->slowest_ms / p->mean_ms, measured.c_str());
    }
  }
  return failures;
}

}  // namespace
}  // namespace ht::bench

int main(int argc, char** argv) {
  ht::bench::Options o;
  o.binary = std::filesystem::path(argv[0]).parent_path().parent_path().string() + "/launcher/hybrid_train";
  CLI::App app{"Pipeline schedules and stage partitions against one rank (hybrid_train under mpirun -np 2)"};
  app.add_option("--binary", o.binary, "hybrid_train to run");
  app.add_option("--steps", o.steps, "steps a run (the first 2 are warm-up)");
  app.add_option("--layers", o.layers, "GPT layers");
  app.add_option("--micro-batches", o.micro_batches, "micro-batches of the global batch of 32 (2, 4, 8, 16)");
  app.add_option("--scratch", o.scratch, "folder for the runs' outputs");
  app.add_option("--reps", o.reps, "runs of each row (interleaved); the one of median step time is reported");
  app.add_flag("--quick", o.quick, "a smoke test: 4 steps, 2 layers, 4 micro-batches");
  CLI11_PARSE(app, argc, argv);
  if (o.quick) {
    o.steps = 4;
    o.layers = 2;
    o.micro_batches = 4;
    o.reps = 1;
  }
  std::filesystem::create_directories(o.scratch);
  int failures = ht::bench::schedules_table(o);
  failures += ht::bench::partition_table(o, ht::bench::gpt_job(o));
  if (!o.quick) failures += ht::bench::partition_table(o, ht::bench::resnet_job(o));  // the smoke test: GPT's only
  if (failures > 0) std::fprintf(stderr, "bench_pipeline: %d failure(s)\n", failures);
  return failures > 0 ? 1 : 0;
}

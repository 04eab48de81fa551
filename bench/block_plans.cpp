// memory.policy = "per_block" (issue 66) against none and full recomputation, measured side by
// side: per job, each block keeping each share of the planner's ladder (planner/plan.h,
// kBlockKeepLadder) of what its backward reads, in a roomy budget; each block keeping what
// torchtitan's per-op selective checkpointing keeps of it (schedule/block_plan.h,
// selective_op_keep: every second product's output and attention's), in bytes, solved, and the
// same bytes with offload to host (memory.block_offload); then in a
// budget of full's own measured peak per_block (the share left to the run check), per_block
// offloading to host what the link hides (memory.block_offload, keeping nothing), DTR and the
// static plan. Each row: the planner's peak and step against the run's (two runs a minute apart,
// the quiet step of both), the step against none's. The memory/time frontier of docs/memory.md
// comes from here. A run that fails, a peak over its budget, or a per_block peak more than 3% off
// the planner's (the engine and the planner's replay record and solve each block alike; with
// offload 5%: backward's prefetches find room as the arena's free blocks let them) is an error
// (exit 1); times are reported, not gated. With --peer, the PyTorch peer's eager step and
// torch.utils.checkpoint around every block (bench/peer/gpu_peer.py) on the GPT, as ratios of its
// own eager step beside ours of none's.
#include "base/remove_tree.h"
#include "bench/bench_util.h"
#include "bench/peer_rows.h"
#include "bench/planner_rows.h"
#include "launcher/config/run_plan_of.h"
#include "planner/recompute_terms.h"
#include "planner/search.h"
#include "schedule/block_plan.h"
#include "runtime/thread_pools.h"

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <unistd.h>
#include <vector>

namespace ht::bench {
namespace {

constexpr double kMiB = 1 << 20;
constexpr int64_t kRoomy = int64_t{1} << 30;

struct Options {
  bool quick = false, keep_runs = false;
  int steps = 8, passes = 2;
  std::string configs = HT_SOURCE_DIR "/configs";
  std::string only;
  std::string peer, peer_script = HT_SOURCE_DIR "/bench/peer/gpu_peer.py";
  int threads = 1;
  Runner runner;
};

// The peer on the job's model (`peer_args`: its shape), on the CPU with the runs' threads: each
// row's step against its eager step, beside ours against none's (`none_ms`, `full_ms`).
void peer_rows(const Options& o, const std::string& peer_args, double none_ms, double full_ms) {
  if (o.peer.empty() || peer_args.empty() || none_ms <= 0) return;
  std::string failure;
  const std::string args = peer_args + " --device cpu --threads " + std::to_string(o.threads) + " --steps " +
                           std::to_string(o.steps) + " --warmup 1";
  std::fprintf(stderr, "[peer] %s %s %s\n", o.peer.c_str(), o.peer_script.c_str(), args.c_str());
  const std::vector<PeerRow> rows = run_peer(o.peer, o.peer_script, args, failure);
  if (rows.empty()) {
    std::printf("\nthe peer failed: %s\n", failure.c_str());
    return;
  }
  double eager = 0;
  for (const PeerRow& r : rows)
    if (r.mode == "eager") eager = r.step_ms;
  std::printf("\nthe peer (%s %s; SGD where ours is AdamW: compare each against its own no-recomputation step):\n",
              o.peer.c_str(), args.c_str());
  std::printf("| %-40s | %9s | %9s | %8s |\n", "run", "step ms", "peak MiB", "x eager");
  std::printf("| %-40s | %9.1f | %9s | %8.2f |\n", "hybrid_train, none", none_ms, "", 1.0);
  if (full_ms > 0) std::printf("| %-40s | %9.1f | %9s | %8.2f |\n", "hybrid_train, full", full_ms, "", full_ms / none_ms);
  for (const PeerRow& r : rows) {
    const std::string name = r.mode == "eager" ? "PyTorch eager" : "torch.utils.checkpoint, every block";
    std::printf("| %-40s | %9.1f | %9s | %8s |\n", name.c_str(), r.step_ms,
                r.peak_bytes >= 0 ? std::to_string(r.peak_bytes >> 20).c_str() : "-",
                eager > 0 ? std::to_string(r.step_ms / eager).substr(0, 4).c_str() : "-");
  }
}

struct Row {
  std::string name;
  Plan plan;
  double tolerance = 0.03;  // the peak held to the planner's within this share (JobTable::row; 0: not held)
};

Measurement run_passes(const Options& o, const Config& config, const Plan& plan, const std::string& name) {
  Measurement m;
  for (int pass = 0; pass < o.passes; ++pass) {
    std::fprintf(stderr, "[%s] run %d of %d\n", name.c_str(), pass + 1, o.passes);
    const Measurement one = measure(o.runner, config, plan, o.steps, name + "_" + std::to_string(pass + 1));
    m = pass == 0 ? one : merge_runs(m, one);
    if (!one.ok) break;
  }
  return m;
}

// memory.policy and memory.block_keep (a share) as a run resolved them (config.resolved.toml).
struct Choice {
  std::string policy;
  double share = 0;
};
Choice resolved_choice(const std::string& path) {
  Choice c;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    auto value = [&](const std::string& key) -> std::optional<std::string> {
      if (line.rfind(key + " = \"", 0) != 0) return std::nullopt;
      const size_t from = key.size() + 4;
      return line.substr(from, line.find('"', from) - from);
    };
    if (auto v = value("policy")) c.policy = *v;
    if (auto v = value("block_keep"); v && v->size() > 1 && v->back() == '%') c.share = std::atof(v->c_str()) / 100;
  }
  return c;
}

std::string pct(double a, double b) {
  char s[32];
  std::snprintf(s, sizeof s, "%+.1f%%", 100.0 * (a - b) / b);
  return s;
}

// The ladder's rows: none, full, and each share of kBlockKeepLadder (one in a smoke run).
std::vector<Row> ladder_rows(const Options& o, const Plan& base) {
  std::vector<Row> rows{{"none", base}};
  Plan full = base;
  full.policy = MemoryPolicy::kFull;
  rows.push_back({"full", full});
  std::vector<double> shares(std::begin(kBlockKeepLadder), std::end(kBlockKeepLadder));
  if (o.quick) shares = {0.5};
  for (double share : shares) {
    Plan p = base;
    p.policy = MemoryPolicy::kPerBlock;
    p.block_keep_share = share;
    char name[48];
    std::snprintf(name, sizeof name, "per_block keeping %.1f%%", 100 * share);
    rows.push_back({name, p});
  }
  return rows;
}

// torchtitan's per-op policy on the block the planner's replay records (the repeating one): the
// row of per_block in its kept bytes, and a note of what each keeps and reruns.
std::optional<Row> per_op_row(const Planned& planned, const Plan& base, std::string& note) {
  Plan probe = base;
  probe.policy = MemoryPolicy::kPerBlock;
  probe.block_keep_share = 1.0;
  const BlockRecomputeReplay probed = block_recompute_terms(planned.plan.profile, probe);
  if (!probed.block) return std::nullopt;
  const schedule::BlockGraph& g = probed.block->graph;
  const schedule::BlockPlan sac = schedule::plan_with(g, schedule::selective_op_keep(g));
  const schedule::BlockPlan solved = schedule::solve_block_plan(g, sac.kept_bytes);
  char text[320];
  std::snprintf(text, sizeof text,
                "torchtitan's per-op policy keeps %.2f of the %.2f MiB a block's backward reads and reruns %d of %zu "
                "ops (%.2f ms modelled); the solver in those bytes keeps %.2f MiB and reruns %d (%.2f ms)",
                sac.kept_bytes / kMiB, g.saved_bytes() / kMiB, sac.recomputed_ops, g.ops.size(), sac.recompute_ms,
                solved.kept_bytes / kMiB, solved.recomputed_ops, solved.recompute_ms);
  note = text;
  Plan p = base;
  p.policy = MemoryPolicy::kPerBlock;
  p.block_keep_bytes = std::max<int64_t>(1, sac.kept_bytes);
  return Row{"per_block in torchtitan's per-op bytes", p};
}

// One job's printed table, row by row; ok() false where a run failed, passed its budget, or (where
// held to it) its peak was mispredicted.
class JobTable {
 public:
  JobTable(const Planned& planned, const std::string& job) : planned_(planned) {
    std::printf("\n%s\n| %-44s | %9s | %9s | %6s | %9s | %9s | %7s | %8s | %9s |\n", job.c_str(), "policy",
                "peak MiB", "predicted", "error", "step ms", "predicted", "error", "x none", "regen ms");
    std::printf("|%s|\n", std::string(139, '-').c_str());
  }
  // `tolerance`: the peak is held to the planner's within this share (none, full and per_block:
  // replayed to the byte, 3%; with offload, 5%); 0 for DTR's and static plans' (their budget's).
  void row(const std::string& name, const Plan& plan, const Measurement& m, double tolerance) {
    if (!m.ok) {
      std::printf("| %-44s | failed: %s\n", name.c_str(), m.error.substr(0, 160).c_str());
      ok_ = false;
      return;
    }
    if (plan.policy == MemoryPolicy::kNone) none_ms_ = m.quiet_ms;
    const Prediction p = predict(planned_.plan.profile, planned_.plan.machine, plan);
    const double peak_error = static_cast<double>(p.peak_bytes) / static_cast<double>(m.peak_bytes) - 1;
    if (m.peak_bytes > plan.budget_bytes || (tolerance > 0 && std::abs(peak_error) > tolerance)) ok_ = false;
    std::printf("| %-44s | %9.1f | %9.1f | %6s | %9.1f | %9.1f | %7s | %8.2f | %9.1f |\n", name.c_str(),
                m.peak_bytes / kMiB, p.peak_bytes / kMiB, pct(p.peak_bytes, m.peak_bytes).c_str(), m.quiet_ms,
                p.step_ms, pct(p.step_ms, m.quiet_ms).c_str(), none_ms_ > 0 ? m.quiet_ms / none_ms_ : 1.0,
                m.recompute_ms);
  }
  // A row whose plan the prediction cannot be given (the run's choice unknown): measured only.
  void unpredicted(const std::string& name, const Measurement& m) {
    if (!m.ok) {
      std::printf("| %-44s | failed: %s\n", name.c_str(), m.error.substr(0, 160).c_str());
      ok_ = false;
      return;
    }
    std::printf("| %-44s | %9.1f | %9s | %6s | %9.1f | %9s | %7s | %8.2f | %9.1f |\n", name.c_str(),
                m.peak_bytes / kMiB, "?", "", m.quiet_ms, "?", "", none_ms_ > 0 ? m.quiet_ms / none_ms_ : 1.0,
                m.recompute_ms);
  }
  bool ok() const { return ok_; }
  double none_ms() const { return none_ms_; }

 private:
  const Planned& planned_;
  bool ok_ = true;
  double none_ms_ = 0;
};

// In a budget of full's measured peak: per_block with the share left to the run check (named by
// what the run resolved: keeping none trains as full), then DTR and the static plan.
void in_fulls_peak(const Options& o, const Planned& planned, const Plan& base, int64_t full_peak,
                   const std::string& stem, JobTable& table) {
  Plan p = base;
  p.policy = MemoryPolicy::kPerBlock;
  p.budget_bytes = full_peak;
  const std::string folder = stem + "_per_block_at_fulls_peak";
  const Measurement m = run_passes(o, planned.config, p, folder);
  const Choice choice = resolved_choice(o.runner.scratch + "/" + folder + "_1/out/config.resolved.toml");
  char name[64];
  if (choice.policy == "full") {
    p.policy = MemoryPolicy::kFull;
    table.row("per_block in full's peak (keeping none: full)", p, m, 0.03);
  } else if (choice.policy == "per_block" && choice.share > 0) {
    p.block_keep_share = choice.share;
    std::snprintf(name, sizeof name, "per_block in full's peak (keeping %.1f%%)", 100 * p.block_keep_share);
    table.row(name, p, m, 0.03);
  } else {
    table.unpredicted("per_block in full's peak (its choice unread)", m);
  }
  // Offload (memory.block_offload): nothing kept on the device, what the link hides on host, the
  // rest regenerated. Its peak within 5%: backward's prefetches fill what room the budget leaves,
  // as the replay's do, but find a free block that fits as the arena lets them.
  Plan off = base;
  off.policy = MemoryPolicy::kPerBlock;
  off.budget_bytes = full_peak;
  off.block_offload = true;
  off.host_budget_bytes = int64_t{4} << 30;
  off.eviction_threshold = 1.0;  // what it held was held back for host swap's prefetches, not needed here
  table.row("per_block + offload in full's peak (0%, to 100%)", off,
            run_passes(o, planned.config, off, stem + "_offload_at_fulls_peak"), 0.05);
  if (o.quick) return;
  for (MemoryPolicy other : {MemoryPolicy::kDtr, MemoryPolicy::kStatic}) {
    Plan q = base;
    q.policy = other;
    q.budget_bytes = full_peak;
    table.row(std::string(choice_name(other)) + " in full's peak", q,
              run_passes(o, planned.config, q, stem + "_" + choice_name(other) + "_at_fulls_peak"), 0.0);
  }
}

// One job's table; false where a run failed, passed its budget, or its peak was mispredicted.
bool run_job(PlanCache& cache, const Options& o, const std::string& job, const JobSpec& spec) {
  PlanArgs args;
  args.device_memory = kRoomy;
  args.policies = {MemoryPolicy::kNone};
  const Planned& planned = cache.get(spec, args);
  const RunPlan run = run_plan_of(planned.config);
  const Plan base{1, run.batch.micro, run.batch.micro_batches, planned.config.training.mixed_precision,
                  MemoryPolicy::kNone, kRoomy};
  std::vector<Row> rows = ladder_rows(o, base);
  std::string per_op_note;
  if (std::optional<Row> r = per_op_row(planned, base, per_op_note)) {
    rows.push_back(*r);
    // The same bytes kept on the device, with offload (nothing held back for swap's prefetches, as
    // in full's peak below): what the link hides goes to host instead of being regenerated. Its
    // peak within 5%, as below.
    Row off = *r;
    off.name = "per_block + offload in torchtitan's bytes";
    off.plan.block_offload = true;
    off.plan.host_budget_bytes = int64_t{4} << 30;
    off.plan.eviction_threshold = 1.0;
    off.tolerance = 0.05;
    if (!o.quick) rows.push_back(off);
  }
  JobTable table(planned, job);
  double full_ms = 0;
  int64_t full_peak = 0;
  const std::string stem = job.substr(0, job.find(' '));
  for (const Row& row : rows) {
    std::string folder = stem + "_" + row.name;
    for (char& c : folder) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
    const Measurement m = run_passes(o, planned.config, row.plan, folder);
    if (row.plan.policy == MemoryPolicy::kFull && m.ok) full_peak = m.peak_bytes, full_ms = m.quiet_ms;
    table.row(row.name, row.plan, m, row.tolerance);
  }
  if (full_peak > 0) in_fulls_peak(o, planned, base, full_peak, stem, table);
  if (!per_op_note.empty()) std::printf("\n%s\n", per_op_note.c_str());
  // gpu_peer.py's GPT is gpt_tiny's (pre-LN, GELU, tied head, dropout 0.1) at the job's shape.
  const auto& m = planned.config.model;
  if (m.name == ModelKind::kGpt) {
    peer_rows(o,
              "--model gpt --batch " + std::to_string(planned.config.training.global_batch_size) + " --seq " +
                  std::to_string(m.block_size) + " --vocab " + std::to_string(planned.info.classes) + " --layers " +
                  std::to_string(m.n_layer) + " --heads " + std::to_string(m.n_head) + " --embd " + std::to_string(m.n_embd),
              table.none_ms(), full_ms);
  }
  return table.ok();
}

}  // namespace
}  // namespace ht::bench

int main(int argc, char** argv) {
  ht::restart_with_passive_openmp(argv);  // as hybrid_train: profiles here must time what its runs time
  CLI::App app{"memory.policy = \"per_block\" against none and full recomputation, measured side by side"};
  ht::bench::Options o;
  o.runner.binary = ht::bench::default_binary();
  app.add_flag("--quick", o.quick, "one job, one share, one pass of a few steps, for a smoke run");
  app.add_option("--binary", o.runner.binary, "the hybrid_train to measure with")->capture_default_str();
  app.add_option("--steps", o.steps, "training steps a run takes")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--passes", o.passes, "runs of each row, one after the other")->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag("--keep-runs", o.keep_runs, "keep every run's config, output and metrics");
  app.add_option("--only", o.only, "only the jobs whose name starts with this (GPT-6L, Llama-6L)");
  app.add_option("--configs", o.configs, "the folder of the example configs")->capture_default_str();
  app.add_option("--peer", o.peer, "a Python with PyTorch (Debian's: /usr/bin/python3): the peer's rows on the GPT");
  app.add_option("--peer-script", o.peer_script, "the peer's script")->capture_default_str();
  int& threads = o.threads;
  app.add_option("--threads", threads, "training.threads for every job")->check(CLI::PositiveNumber)->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (o.quick) o.steps = 3, o.passes = 1;
  char scratch[] = "/tmp/bench_block_plans_XXXXXX";
  if (mkdtemp(scratch) == nullptr) {
    std::perror("mkdtemp");
    return 2;
  }
  o.runner.scratch = scratch;
  const std::string t = "training.threads=" + std::to_string(threads);
  // bench_auto_policy's GPT-6L and Llama-6L (bench_dtr_budget's shapes: 6 layers of 256, 128
  // tokens, 8 sequences).
  std::vector<std::pair<std::string, ht::bench::JobSpec>> jobs{
      {"GPT-6L (gpt_tiny.toml at 6 x 256, T128 b8)",
       {o.configs + "/gpt_tiny.toml", {t, "model.n_layer=6", "model.n_head=8", "model.n_embd=256",
                                       "model.block_size=128", "training.global_batch_size=8"}}},
      {"Llama-6L (llama_debug.toml at 6 x 256, T128 b8, 4096 words)",
       {o.configs + "/llama_debug.toml",
        {t, "model.n_layer=6", "model.n_head=8", "model.n_kv_heads=4", "model.n_embd=256", "model.multiple_of=64",
         "model.block_size=128", "model.vocab_size=4096", "data.dataset=synthetic", "data.synthetic_classes=4096",
         "data.synthetic_samples=512", "training.global_batch_size=8"}}}};
  if (o.quick) {  // the smoke: a smaller GPT (each of its runs a few seconds on two cores)
    jobs.resize(1);
    jobs[0].first = "GPT-4L (gpt_tiny.toml at 4 x 128, T64 b8)";
    jobs[0].second.overrides = {t, "model.n_layer=4", "model.n_head=4", "model.n_embd=128", "model.block_size=64",
                                "training.global_batch_size=8"};
  }
  ht::bench::PlanCache cache;
  bool ok = true;
  for (const auto& [name, spec] : jobs) {
    if (!o.only.empty() && name.rfind(o.only, 0) != 0) continue;
    ok = ht::bench::run_job(cache, o, name, spec) && ok;
  }
  if (!o.keep_runs) ht::remove_tree(o.runner.scratch);
  std::printf("\n%s\n", ok ? "every run within its budget, every peak held to the planner's (3%, with offload 5%)"
                           : "FAILED: a run failed, passed its budget, or its peak was further off the planner's than its row allows");
  return ok ? 0 : 1;
}

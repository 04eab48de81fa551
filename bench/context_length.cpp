// The longest sequence that trains at context_parallel = 1, 2, 4 (issue 68's measure): a small
// Llama (grouped-query attention) on CPU ranks, one sequence a step, AdamW in fp32, each rank's
// memory.budget its fixed bytes (the model's state: parameters, gradients and AdamW's two moments)
// plus a fixed allowance for everything else, and no memory policy (nothing is evicted: a run
// fits when no allocation fails). For each c, the sequence length is searched (binary, in steps of
// 2c x 16 tokens: fitting is monotone in the length) by running hybrid_train for 2 steps under
// mpirun with c ranks, for each way the keys and values meet the queries (parallel.context_exchange):
// passed round a ring, a rank holds two chunks of them (2T / c) and attends block by block to a
// chunk's pieces; gathered, it holds the whole sequence's keys and values (and their fp32 gradient
// sums) while its attention runs, and scores each block against all of them, so the length grows by
// less than c. The bar for the ring is 0.9c. Prints one table; exits 1 when a run fails
// other than by its budget (exit status 2 naming memory.budget).
#include "bench/bench_util.h"
#include "base/remove_tree.h"

#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace ht::bench {
namespace {

struct Options {
  int64_t layers = 2, width = 64, heads = 8, kv_heads = 4, max_tokens = 16384;
  int64_t allowance_mib = 8;
  std::vector<int> contexts{1, 2, 4};
  std::vector<std::string> exchanges{"ring", "all_gather"};
  std::string binary, mpirun, scratch = "/tmp/ht_bench_context_length";
};

// Llama's MLP hidden width at multiple_of 16: 2/3 of 4 x width, rounded up (models/decoder_options.cpp).
int64_t parameters(const Options& o) {
  const int64_t d = o.width, hd = d / o.heads, vocab = 256;
  const int64_t hidden = (8 * d / 3 + 15) / 16 * 16;
  const int64_t layer = d * (o.heads + 2 * o.kv_heads) * hd + o.heads * hd * d + 2 * hidden * d + hidden * d + 2 * d;
  return 2 * vocab * d + o.layers * layer + d;  // embedding, layers, head (untied), final norm
}

std::string toml(const Options& o) {
  std::ostringstream s;
  s << "[model]\nname = \"llama\"\nn_layer = " << o.layers << "\nn_head = " << o.heads << "\nn_kv_heads = " << o.kv_heads
    << "\nn_embd = " << o.width << "\nmultiple_of = 16\ntie_embeddings = false\n"
    << "[data]\ndataset = \"synthetic\"\nsynthetic_samples = 8\nsynthetic_eval_samples = 1\nsynthetic_classes = 256\n"
    << "[training]\nsteps = 2\nglobal_batch_size = 1\noptimizer = \"adamw\"\nthreads = 1\n"
    << "[memory]\npolicy = \"none\"\ncheck_fit = false\n[checkpoint]\ninterval = 0\n[metrics]\nlog_interval = 1\n";
  return s.str();
}

struct Probe {
  bool fits = false, budget = false;  // trained; or refused by its budget (exit 2 naming memory.budget)
  int64_t peak = 0;                   // the arena's peak (rank 0), where it trained
  std::string output;                 // the end of the run's output, where it did not
};

Probe run(const Options& o, int c, const std::string& exchange, int64_t tokens, const std::string& budget) {
  const std::string name = "c" + std::to_string(c) + exchange + "_T" + std::to_string(tokens);
  const std::string out = o.scratch + "/" + name, log = o.scratch + "/" + name + ".log";
  std::ostringstream cmd;
  if (c > 1) cmd << o.mpirun << " --allow-run-as-root --oversubscribe -np " << c << " ";
  cmd << o.binary << " " << o.scratch << "/job.toml --model.block_size=" << tokens << " --data.synthetic_shape=[" << tokens
      << "] --parallel.context_parallel=" << c << (c > 1 ? " --parallel.context_exchange=" + exchange : "")
      << " --memory.budget=" << budget << " --job.output_dir=" << out << " > "
      << log << " 2>&1";
  const int status = std::system(cmd.str().c_str());
  Probe p;
  p.output = read_all(log);
  p.fits = status == 0;
  p.budget = !p.fits && p.output.find("memory.budget") != std::string::npos;
  if (p.fits) {
    std::ifstream metrics(out + "/metrics.jsonl");
    for (std::string line; std::getline(metrics, line);) {
      if (const auto peak = json_number(line, "mem_peak_bytes")) p.peak = std::max(p.peak, static_cast<int64_t>(*peak));
    }
  }
  ht::remove_tree(out);
  return p;
}

struct Row {
  int c = 1;
  std::string exchange;  // "" at c = 1
  int64_t tokens = 0, peak = 0;
};

// The longest sequence, in steps of 2c x 16 tokens, that trains at c with `exchange`.
Row longest(const Options& o, int c, const std::string& exchange, int64_t budget, bool& ok) {
  const int64_t unit = 2 * c * 16;
  int64_t lo = 0, hi = o.max_tokens / unit;  // in units; lo fits (0: nothing)
  Row row{c, exchange};
  while (lo < hi && ok) {
    const int64_t mid = (lo + hi + 1) / 2;
    const Probe p = run(o, c, exchange, mid * unit, std::to_string(budget));
    std::printf("  c %d %s, T %6lld: %s\n", c, exchange.c_str(), static_cast<long long>(mid * unit),
                p.fits ? ("trains, peak " + std::to_string(p.peak) + " bytes").c_str() : p.budget ? "over the budget" : "FAILED");
    std::fflush(stdout);
    if (!p.fits && !p.budget) {
      std::printf("%s\n", p.output.substr(p.output.size() > 2000 ? p.output.size() - 2000 : 0).c_str());
      ok = false;
    }
    if (p.fits) lo = mid, row.peak = p.peak;
    else hi = mid - 1;
  }
  row.tokens = lo * unit;
  return row;
}

}  // namespace
}  // namespace ht::bench

int main(int argc, char** argv) {
  using namespace ht::bench;
  Options o;
  o.binary = hybrid_train_beside_this_program();
#ifdef HT_MPIEXEC
  o.mpirun = HT_MPIEXEC;
#endif
  bool quick = false;
  CLI::App app{"The longest sequence a small Llama trains at context_parallel = 1, 2, 4 in each rank's fixed bytes "
               "plus a fixed allowance, with keys and values passed round a ring or gathered"};
  app.add_option("--contexts", o.contexts, "context_parallel counts (the first is the ratios' base)")->delimiter(',');
  app.add_option("--exchanges", o.exchanges, "parallel.context_exchange values, at each c > 1")->delimiter(',');
  app.add_option("--allowance-mib", o.allowance_mib, "MiB a rank has beyond the model's state");
  app.add_option("--layers", o.layers, "n_layer");
  app.add_option("--width", o.width, "n_embd");
  app.add_option("--max-tokens", o.max_tokens, "the longest sequence tried");
  app.add_option("--binary", o.binary, "hybrid_train");
  app.add_option("--mpirun", o.mpirun, "mpirun");
  app.add_option("--scratch", o.scratch, "a folder for the runs (emptied first)");
  app.add_flag("--quick", quick, "a smoke run: 2 MiB allowance, c = 1 and 2 (the ring), at most 2048 tokens");
  CLI11_PARSE(app, argc, argv);
  if (quick) o.allowance_mib = 2, o.contexts = {1, 2}, o.exchanges = {"ring"}, o.max_tokens = 2048;
  if (o.mpirun.empty()) {
    std::fprintf(stderr, "bench_context_length: needs mpirun (--mpirun; none found at build time)\n");
    return 2;
  }
  ht::remove_tree(o.scratch);
  std::filesystem::create_directories(o.scratch);
  std::ofstream(o.scratch + "/job.toml") << toml(o);
  const int64_t state = 16 * parameters(o);  // fp32 parameters, gradients and AdamW's two moments
  const int64_t budget = state + (o.allowance_mib << 20);
  std::printf("bench_context_length: Llama %lld layers, n_embd %lld, %lld heads over %lld key/value heads, one "
              "sequence a step, AdamW fp32, no memory policy; memory.budget %lld bytes a rank (state %.2f MiB + "
              "%lld MiB); runs in %s\n\n",
              static_cast<long long>(o.layers), static_cast<long long>(o.width), static_cast<long long>(o.heads),
              static_cast<long long>(o.kv_heads), static_cast<long long>(budget), static_cast<double>(state) / (1 << 20),
              static_cast<long long>(o.allowance_mib), o.scratch.c_str());
  std::vector<Row> rows;
  bool ok = true;
  for (int c : o.contexts) {
    for (const std::string& exchange : c == 1 ? std::vector<std::string>{""} : o.exchanges) {
      rows.push_back(longest(o, c, exchange, budget, ok));
    }
  }
  std::printf("\n| context_parallel | context_exchange | longest sequence (tokens) | vs c = %d | the ring's bar (0.9c) | peak at it (rank 0) |\n"
              "| --- | --- | --- | --- | --- | --- |\n", rows.front().c);
  for (const Row& r : rows) {
    const double ratio = rows.front().tokens > 0 ? static_cast<double>(r.tokens) / static_cast<double>(rows.front().tokens) : 0;
    const double bar = 0.9 * r.c / rows.front().c;
    const std::string meets = r.exchange != "ring" ? "" : ratio >= bar ? " (met)" : " (short)";
    std::printf("| %d | %s | %lld%s | %.2fx | %.1fx%s | %.2f MiB |\n", r.c, r.exchange.empty() ? "-" : r.exchange.c_str(),
                static_cast<long long>(r.tokens), r.tokens >= o.max_tokens - 2 * r.c * 16 + 1 ? " (--max-tokens)" : "", ratio,
                bar, meets.c_str(), static_cast<double>(r.peak) / (1 << 20));
  }
  if (!ok) std::printf("\nFAILED: a run failed other than by its budget\n");
  return ok ? 0 : 1;
}

// The planner beside torchtitan's published context-parallel rows (issue 68): Llama 3 8B on one
// node of 8 H100s, the longest sequence each context-parallel degree trained (CP 1 at 32K tokens,
// CP 2 at 64K, CP 4 at 128K, CP 8 at 262K; FSDP over the 8 GPUs, one sequence a data-parallel
// rank). For each row `hybrid_train plan configs/llama3_8b.toml --cluster h100-sxm:1x8 --tensor 1`
// plans this trainer at that degree (parallel.context_parallel, the ring) and that length, and at
// twice it: whether a plan fits, which, and its predicted peak per GPU (or the smallest peak of
// any plan). Lengths, not tokens a second: the published rows ran Float8 and torch.compile on
// 96 GB cards, which this trainer does not. Prints one table; exits 1 when a plan fails other
// than by not fitting. Then the planner's own choice: at a global batch of 8 sequences and some of
// the published lengths, `--context 1,2,4,8` (what `hybrid_train plan` searches by itself from
// 16K tokens with parallel.context_parallel = 1) picks the degree, and the table shows which.
#include "bench/bench_util.h"
#include "base/remove_tree.h"

#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace ht::bench {
namespace {

struct Row {
  int context = 1;
  int64_t published = 0;  // tokens: the published row's sequence
};

struct Outcome {
  bool planned = false;  // the plan command ran (a plan fits: exit 0; none: exit 2)
  bool fits = false;
  double peak_gib = 0;  // the chosen plan's, or the smallest of any plan's
  std::string plan;     // the chosen plan's policy and shard level
  int context = 0;      // the chosen plan's context-parallel degree
  double step_ms = 0;   // the chosen plan's predicted step
  std::string output;
};

std::string json_string(const std::string& line, const std::string& key) {
  const std::string head = "\"" + key + "\": \"";  // as plans.jsonl writes it
  const size_t at = line.find(head);
  if (at == std::string::npos) return "";
  const size_t from = at + head.size();
  return line.substr(from, line.find('"', from) - from);
}

// Plans at `tokens` with the context degrees `contexts` ("4", or "1,2,4,8" to search them) and
// `global_batch` sequences a step.
Outcome plan(const std::string& binary, const std::string& config, const std::string& scratch, const std::string& contexts,
             int64_t tokens, int64_t global_batch) {
  const std::string out = scratch + "/c" + contexts + "_T" + std::to_string(tokens), log = out + ".log";
  std::ostringstream cmd;
  cmd << binary << " plan " << config << " --cluster h100-sxm:1x8 --tensor 1 --ranks 8 --model.block_size=" << tokens
      << " --training.global_batch_size=" << global_batch << " --context " << contexts << " --job.output_dir=" << out
      << " > " << log << " 2>&1";
  const int status = std::system(cmd.str().c_str());
  Outcome o;
  o.output = read_all(log);
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  o.planned = code == 0 || (code == 2 && o.output.find("no plan fits") != std::string::npos);
  o.fits = code == 0;
  if (o.fits) {
    std::ifstream plans(out + "/plans.jsonl");
    std::string first;
    std::getline(plans, first);
    if (const auto peak = json_number(first, "peak_bytes")) o.peak_gib = *peak / (1024.0 * 1024 * 1024);
    o.plan = json_string(first, "policy") + ", shard " + json_string(first, "shard");
    o.context = static_cast<int>(json_number(first, "context_parallel").value_or(0));
    o.step_ms = json_number(first, "step_ms").value_or(0);
  } else if (o.planned) {
    const std::string mark = "the smallest predicted peak is ";
    const size_t at = o.output.find(mark);
    if (at != std::string::npos) o.peak_gib = std::atof(o.output.c_str() + at + mark.size());
  }
  ht::remove_tree(out);
  return o;
}

std::string cell(const Outcome& o) {
  char text[160];
  if (o.fits) {
    std::snprintf(text, sizeof text, "fits: %s, %.1f GiB", o.plan.c_str(), o.peak_gib);
  } else {
    std::snprintf(text, sizeof text, "no plan fits (smallest peak %.1f GiB)", o.peak_gib);
  }
  return text;
}

}  // namespace
}  // namespace ht::bench

int main(int argc, char** argv) {
  using namespace ht::bench;
  std::string binary = hybrid_train_beside_this_program(), config = std::string(HT_SOURCE_DIR) + "/configs/llama3_8b.toml";
  std::string scratch = "/tmp/ht_bench_context_at_scale";
  bool quick = false;
  CLI::App app{"Llama 3 8B on 8 H100s planned at torchtitan's published context-parallel rows' lengths, and twice them"};
  app.add_option("--binary", binary, "hybrid_train");
  app.add_option("--config", config, "the Llama 3 8B config");
  app.add_option("--scratch", scratch, "a folder for the plans (emptied first)");
  app.add_flag("--quick", quick, "a smoke run: CP 1 and 2 at 4K and 8K tokens, the choice between them at 8K");
  CLI11_PARSE(app, argc, argv);
  std::vector<Row> rows{{1, 32768}, {2, 65536}, {4, 131072}, {8, 262144}};
  // The planner's choice: up to 128K (a 128K search holds four traces, about 12 GB here).
  std::vector<int64_t> chosen_at{32768, 131072};
  std::string searched = "1,2,4,8";
  if (quick) {
    rows = {{1, 4096}, {2, 8192}};
    chosen_at = {8192};
    searched = "1,2";
  }
  ht::remove_tree(scratch);
  std::filesystem::create_directories(scratch);
  std::printf("bench_context_at_scale: %s planned for 8 H100s (h100-sxm, one node), tensor_parallel 1, one sequence "
              "a data-parallel rank, parallel.context_exchange = ring\n\n", config.c_str());
  std::string table = "| CP | published longest (torchtitan, 8 H100) | this trainer at it | at twice it |\n"
                      "| --- | --- | --- | --- |\n";
  bool ok = true;
  for (const Row& r : rows) {
    const int64_t batch = 8 / r.context;  // one sequence a data-parallel rank
    const Outcome at = plan(binary, config, scratch, std::to_string(r.context), r.published, batch);
    const Outcome twice = plan(binary, config, scratch, std::to_string(r.context), 2 * r.published, batch);
    for (const Outcome* o : {&at, &twice}) {
      if (!o->planned) {
        std::printf("FAILED: CP %d:\n%s\n", r.context, o->output.substr(o->output.size() > 2000 ? o->output.size() - 2000 : 0).c_str());
        ok = false;
      }
    }
    char line[512];
    std::snprintf(line, sizeof line, "| %d | %lld | %s | %s |\n", r.context, static_cast<long long>(r.published),
                  cell(at).c_str(), cell(twice).c_str());
    table += line;
    std::printf("  CP %d done\n", r.context);
    std::fflush(stdout);
  }
  std::printf("\n%s", table.c_str());
  std::string choices = "| tokens | context degrees searched | chosen | predicted step ms |\n| --- | --- | --- | --- |\n";
  for (int64_t tokens : chosen_at) {
    const Outcome o = plan(binary, config, scratch, searched, tokens, 8);
    if (!o.planned) {
      std::printf("FAILED: the search at %lld tokens:\n%s\n", static_cast<long long>(tokens),
                  o.output.substr(o.output.size() > 2000 ? o.output.size() - 2000 : 0).c_str());
      ok = false;
    }
    char line[512];
    std::snprintf(line, sizeof line, "| %lld | %s | %s | %s |\n", static_cast<long long>(tokens), searched.c_str(),
                  o.fits ? ("CP " + std::to_string(o.context) + ", " + cell(o)).c_str() : cell(o).c_str(),
                  o.fits ? std::to_string(static_cast<long long>(o.step_ms)).c_str() : "-");
    choices += line;
    std::printf("  search at %lld tokens done\n", static_cast<long long>(tokens));
    std::fflush(stdout);
  }
  std::printf("\nThe planner's choice, global batch 8 sequences:\n\n%s", choices.c_str());
  return ok ? 0 : 1;
}

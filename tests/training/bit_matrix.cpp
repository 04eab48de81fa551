// The bit matrix: hybrid_train trained a few steps under every memory policy, every parallel layout
// the suite runs (data, pipeline, tensor and sequence parallelism, ZeRO 1-3, their combinations)
// and each precision, each run's losses and a hash of its final checkpoint's model compared with
// tests/fixtures/bit_matrix.txt. A change that moves code (issue 63's trainer of parts) must leave
// every entry byte-identical; one that changes an order on purpose records the new fixture
// (--record) in the commit that says which entries change and why.
//
//   bit_matrix HYBRID_TRAIN FIXTURE [--record] [--only SUBSTRING] [--keep DIR]
//
// Prints one line per entry (same, DIFFERENT, new, or FAILED with the run's log) and exits 1 if
// any entry differs or fails. Budgets are shares of the same layout's roomy peak measured in the
// same invocation, so that a change of a few bytes in what the trainer holds moves the budget with
// it; the bits do not depend on the budget (every policy trains bit for bit as without one). The
// kernels' instruction sets are pinned (ATen's AVX2 kernels, OpenBLAS's Haswell ones, oneDNN's up
// to AVX2 in fp32), so that the hashes do not depend on which x86-64 machine runs them; bf16's
// products need oneDNN's AVX-512 kernels (capped at AVX512_CORE: the same bits with or without
// AVX512_BF16), and its entries are compared only on a machine that has them.
#include "training/checkpoint.h"
#include "base/remove_tree.h"
#include "tests/support/cpu_features.h"

#include <ATen/ATen.h>
#include <torch/version.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

// 4 GPT layers of width 96 (two 1 MiB buckets), dropout, AdamW with clipping that bites; 16
// sequences a step in micro-batches of 4, 3 steps, a checkpoint at the end.
const char* kGpt = R"([model]
name = "gpt"
n_layer = 4
n_head = 4
n_embd = 96
block_size = 16
dropout = 0.1
[data]
dataset = "synthetic"
synthetic_samples = 128
synthetic_eval_samples = 16
synthetic_shape = [16]
synthetic_classes = 64
[training]
steps = 3
global_batch_size = 16
micro_batch_size = 4
optimizer = "adamw"
lr = 0.01
warmup_steps = 1
grad_clip = 0.5
eval_batches = 1
threads = 1
[parallel]
stage_costs = "modeled"
bucket_mb = 1
timeout_s = 120
[checkpoint]
interval = 3
[metrics]
log_interval = 1
)";

// A Llama of 2 layers with grouped-query attention and dropout: the tensor-parallel layouts.
const char* kLlama = R"([model]
name = "llama"
n_layer = 2
n_head = 4
n_kv_heads = 2
n_embd = 64
multiple_of = 16
block_size = 16
dropout = 0.1
[data]
dataset = "synthetic"
synthetic_samples = 128
synthetic_eval_samples = 16
synthetic_shape = [16]
synthetic_classes = 64
[training]
steps = 3
global_batch_size = 16
micro_batch_size = 4
optimizer = "adamw"
lr = 0.01
grad_clip = 0.5
eval_batches = 1
threads = 1
[parallel]
stage_costs = "modeled"
timeout_s = 120
[checkpoint]
interval = 3
[metrics]
log_interval = 1
)";

// A ConvNet (channels-last convolutions, relu, pooling, dropout) under SGD with momentum.
const char* kConvNet = R"([model]
name = "convnet"
channels = [8, 16]
fc_hidden = 32
dropout = 0.1
[data]
dataset = "synthetic"
synthetic_samples = 128
synthetic_eval_samples = 16
synthetic_shape = [1, 16, 16]
[training]
steps = 3
global_batch_size = 16
micro_batch_size = 8
optimizer = "sgd"
lr = 0.05
eval_batches = 1
threads = 1
[checkpoint]
interval = 3
[metrics]
log_interval = 1
)";

struct Entry {
  std::string name;
  const char* base;
  int ranks;
  std::string args;
  // The entry whose run the budget comes from (empty: none), and the share of its activations' peak
  // the budget leaves room for above what cannot be evicted.
  std::string roomy;
  double share = 0;
};

// The matrix, each layout's roomy run before the budgets that are shares of its peak.
std::vector<Entry> entries() {
  std::vector<Entry> out;
  const std::vector<std::pair<std::string, std::string>> precisions{{"fp32", "off"}, {"bf16", "bf16"}};
  for (const auto& [tag, precision] : precisions) {
    const std::string p = " --training.mixed_precision=" + precision;
    auto add = [&](const std::string& name, const char* base, int ranks, const std::string& args,
                   const std::string& roomy = "", double share = 0) {
      out.push_back({name + "." + tag, base, ranks, args + p, roomy.empty() ? "" : roomy + "." + tag, share});
    };
    // One rank: every memory policy.
    add("gpt.none", kGpt, 1, "");
    add("gpt.roomy", kGpt, 1, " --memory.budget=1GiB --memory.policy=none");
    for (const char* policy : {"dtr", "dtr_eq", "megengine", "lru", "largest", "full", "swap", "hybrid"}) {
      add(std::string("gpt.") + policy, kGpt, 1, std::string(" --memory.policy=") + policy, "gpt.roomy", 0.65);
    }
    add("gpt.per_block", kGpt, 1, " --memory.policy=per_block --memory.block_keep=50%", "gpt.roomy", 0.65);
    // Offload (memory.block_offload): nothing kept on the device, what the link hides on host.
    add("gpt.offload", kGpt, 1, " --memory.policy=per_block --memory.block_keep=0% --memory.block_offload=true "
        "--memory.host_budget=64MiB", "gpt.roomy", 0.65);
    add("gpt.static", kGpt, 1, " --memory.policy=static --memory.solve_time_s=0", "gpt.roomy", 0.65);
    add("gpt.segments", kGpt, 1, " --memory.policy=segments", "gpt.roomy", 0.65);
    add("gpt.hybrid.state_host", kGpt, 1, " --memory.policy=hybrid --memory.optimizer_state=host", "gpt.roomy", 0.65);
    // Not memory.compress = "bf16": which activations cross the link rounded depends on when the
    // link's copies finish, so its bits change from run to run.
    add("convnet.none", kConvNet, 1, "");
    add("convnet.roomy", kConvNet, 1, " --memory.budget=1GiB --memory.policy=none");
    add("convnet.dtr", kConvNet, 1, " --memory.policy=dtr", "convnet.roomy", 0.85);
    add("convnet.swap", kConvNet, 1, " --memory.policy=swap", "convnet.roomy", 0.85);
    add("convnet.lossless", kConvNet, 1, " --memory.compress=lossless");
    // Data parallelism and ZeRO.
    add("gpt.dp2", kGpt, 2, "");
    add("gpt.dp2.no_overlap", kGpt, 2, " --parallel.overlap=false");
    add("gpt.dp2.zero1", kGpt, 2, " --parallel.shard=optimizer");
    add("gpt.dp2.zero2", kGpt, 2, " --parallel.shard=gradients");
    add("gpt.dp2.zero3", kGpt, 2, " --parallel.shard=parameters");
    add("gpt.dp2.zero3.no_prefetch", kGpt, 2, " --parallel.shard=parameters --parallel.prefetch=0");
    add("gpt.dp2.roomy", kGpt, 2, " --memory.budget=1GiB --memory.policy=none");
    add("gpt.dp2.dtr", kGpt, 2, " --memory.policy=dtr", "gpt.dp2.roomy", 0.65);
    add("gpt.dp2.zero3.roomy", kGpt, 2, " --parallel.shard=parameters --memory.budget=1GiB --memory.policy=none");
    // In bf16 the two ranks' gathers and reduce-scatters part ways under DTR and the job hangs
    // (found by this matrix on 2026-12-01; docs/status.md): fp32 only until that is fixed.
    if (precision == "off") {
      add("gpt.dp2.zero3.dtr", kGpt, 2, " --parallel.shard=parameters --memory.policy=dtr", "gpt.dp2.zero3.roomy", 0.65);
    }
    // Pipeline stages.
    add("gpt.pp2", kGpt, 2, " --parallel.pipeline_parallel=2");
    add("gpt.pp2.gpipe", kGpt, 2, " --parallel.pipeline_parallel=2 --parallel.pipeline_schedule=gpipe");
    add("gpt.pp2.zb_h1", kGpt, 2, " --parallel.pipeline_parallel=2 --parallel.pipeline_schedule=zb_h1");
    add("gpt.pp2.interleaved", kGpt, 2,
        " --parallel.pipeline_parallel=2 --parallel.pipeline_schedule=interleaved_1f1b --parallel.virtual_stages=2");
    add("gpt.pp2.roomy", kGpt, 2, " --parallel.pipeline_parallel=2 --memory.budget=1GiB --memory.policy=none");
    add("gpt.pp2.dtr", kGpt, 2, " --parallel.pipeline_parallel=2 --memory.policy=dtr", "gpt.pp2.roomy", 0.65);
    add("gpt.pp2.full", kGpt, 2, " --parallel.pipeline_parallel=2 --memory.policy=full", "gpt.pp2.roomy", 0.65);
    add("gpt.pp2.per_block", kGpt, 2, " --parallel.pipeline_parallel=2 --memory.policy=per_block --memory.block_keep=50%",
        "gpt.pp2.roomy", 0.65);
    // A share per stage (AdaPipe's plan): the first stage recomputes every block, the second keeps 75%.
    add("gpt.pp2.per_stage", kGpt, 2,
        " --parallel.pipeline_parallel=2 --memory.policy=per_block --memory.block_keep=0%,75%", "gpt.pp2.roomy", 0.65);
    add("gpt.pp2.offload", kGpt, 2, " --parallel.pipeline_parallel=2 --memory.policy=per_block --memory.block_keep=0%,50% "
        "--memory.block_offload=true --memory.host_budget=64MiB", "gpt.pp2.roomy", 0.65);
    add("gpt.dp2.pp2", kGpt, 4, " --parallel.pipeline_parallel=2");
    add("gpt.dp2.pp2.zero1", kGpt, 4, " --parallel.pipeline_parallel=2 --parallel.shard=optimizer");
    // Tensor and sequence parallelism: fp32 only, since MPI's collectives take no bf16 tensors
    // (found by this matrix on 2026-12-01; docs/status.md).
    add("llama.none", kLlama, 1, "");
    if (precision != "off") continue;
    add("llama.tp2", kLlama, 2, " --parallel.tensor_parallel=2");
    add("llama.tp2.sp", kLlama, 2, " --parallel.tensor_parallel=2 --parallel.sequence_parallel=true");
    add("llama.tp2.roomy", kLlama, 2, " --parallel.tensor_parallel=2 --memory.budget=1GiB --memory.policy=none");
    add("llama.tp2.dtr", kLlama, 2, " --parallel.tensor_parallel=2 --memory.policy=dtr", "llama.tp2.roomy", 0.65);
    add("llama.tp2.full", kLlama, 2, " --parallel.tensor_parallel=2 --memory.policy=full", "llama.tp2.roomy", 0.65);
    add("llama.tp2.per_block", kLlama, 2, " --parallel.tensor_parallel=2 --memory.policy=per_block --memory.block_keep=50%",
        "llama.tp2.roomy", 0.65);
    add("llama.dp2.tp2.zero1", kLlama, 4, " --parallel.tensor_parallel=2 --parallel.shard=optimizer");
    add("llama.dp2.tp2.zero3", kLlama, 4, " --parallel.tensor_parallel=2 --parallel.shard=parameters");
    add("llama.tp2.pp2", kLlama, 4, " --parallel.tensor_parallel=2 --parallel.pipeline_parallel=2");
  }
  // fp16 (the loss scaler) needs a GPU: ATen lacks its CPU kernels.
  return out;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// FNV-1a over each tensor's name, dtype, sizes and bytes, in name order.
std::string model_hash(const std::string& folder) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* data, size_t n) {
    const auto* bytes = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  };
  for (const auto& [name, tensor] : ht::CheckpointStore::model_tensors(folder)) {
    const at::Tensor t = tensor.contiguous();
    const std::string head = name + ":" + std::string(c10::toString(t.scalar_type())) + ":" + c10::str(t.sizes());
    mix(head.data(), head.size());
    mix(t.data_ptr(), static_cast<size_t>(t.numel()) * t.element_size());
  }
  char text[20];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(h));
  return text;
}

// Every "loss" of the train records, as written (6 significant digits), joined by commas.
std::string losses(const std::string& metrics) {
  std::string out;
  std::istringstream lines(metrics);
  const std::regex loss("\"loss\": ([^,}]+)");
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (line.find("\"event\": \"train\"") != std::string::npos && std::regex_search(line, m, loss)) {
      out += (out.empty() ? "" : ",") + m[1].str();
    }
  }
  return out;
}

// The largest of the named numbers (or lists of numbers) in the train records.
int64_t largest(const std::string& metrics, const std::string& names) {
  int64_t peak = 0;
  const std::regex number("\"(" + names + ")\": \\[?([0-9., e+]+)");
  for (auto it = std::sregex_iterator(metrics.begin(), metrics.end(), number); it != std::sregex_iterator(); ++it) {
    std::istringstream values((*it)[2].str());
    for (std::string v; std::getline(values, v, ',');) {
      if (v.find_first_of("0123456789") != std::string::npos) peak = std::max(peak, static_cast<int64_t>(std::stod(v)));
    }
  }
  return peak;
}

struct Result {
  std::string losses, hash;
  int64_t peak = 0, activations = 0;
  bool ok = false;
  std::string log;
};

Result run_entry(const Entry& e, const std::string& binary, const std::string& dir, int64_t budget) {
  std::filesystem::create_directories(dir);
  const std::string config = dir + "/job.toml";
  std::ofstream(config) << e.base;
  std::string command;
  if (e.ranks > 1) {
    command = "mpirun --allow-run-as-root --oversubscribe -x ATEN_CPU_CAPABILITY -x OPENBLAS_CORETYPE "
              "-x ONEDNN_MAX_CPU_ISA -np " + std::to_string(e.ranks) + " ";
  }
  command += binary + " " + config + e.args + " --job.output_dir=" + dir + "/run";
  if (budget > 0) command += " --memory.budget=" + std::to_string(budget);
  Result r;
  r.log = dir + "/log.txt";
  const int status = std::system((command + " > " + r.log + " 2>&1").c_str());
  const std::string checkpoint = dir + "/run/checkpoints/step_00000003";
  if (status != 0 || !std::filesystem::is_directory(checkpoint)) return r;
  const std::string metrics = read_text(dir + "/run/metrics.jsonl");
  r.losses = losses(metrics);
  // A budget a share of the way from what cannot be evicted to the peak: the peak less a share of
  // the activations' (the first rank's; a pipeline's stages differ, so their peaks count whole).
  r.peak = largest(metrics, "mem_peak_bytes|stage_peak_bytes|rank_peak_bytes");
  r.activations = largest(metrics, "activation_peak_bytes");
  r.hash = model_hash(checkpoint);
  r.ok = true;
  return r;
}

struct Recorded {
  std::string losses, hash;
};

std::map<std::string, Recorded> read_fixture(const std::string& path) {
  std::map<std::string, Recorded> out;
  std::istringstream lines(read_text(path));
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream words(line);
    std::string name, hash, loss;
    words >> name >> hash >> loss;
    out[name] = {loss, hash};
  }
  return out;
}

bool bf16_entry(const Entry& e) { return e.args.find("mixed_precision=bf16") != std::string::npos; }

// The runs of the matrix, their results, and what is printed of them.
struct Matrix {
  std::string binary, root;
  bool record = false;
  std::map<std::string, Recorded> expected;
  std::map<std::string, Result> results;
  int differ = 0, failed = 0, checked = 0;
  std::string out_text;

  // The budget of `e` from its roomy run's peak (0: none); -1 where that run has none.
  int64_t budget_of(const Entry& e) const {
    if (e.roomy.empty()) return 0;
    const auto roomy = results.find(e.roomy);
    if (roomy == results.end() || !roomy->second.ok || roomy->second.peak <= 0) return -1;
    const double peak = static_cast<double>(roomy->second.peak);
    const double activations = static_cast<double>(roomy->second.activations);
    return static_cast<int64_t>(peak - (1 - e.share) * activations) / 64 * 64;
  }

  // Runs `group` at once (entries of one precision), then reports each in order.
  void run(const std::string& only, const std::vector<const Entry*>& group) {
    std::vector<int64_t> budgets;
    for (const Entry* e : group) budgets.push_back(budget_of(*e));
    setenv("ONEDNN_MAX_CPU_ISA", bf16_entry(*group.front()) ? "AVX512_CORE" : "AVX2", 1);
    std::vector<Result> runs(group.size());
    std::vector<double> seconds(group.size());
    std::vector<std::thread> threads;
    for (size_t j = 0; j < group.size(); ++j) {
      if (budgets[j] < 0) continue;
      threads.emplace_back([&, j] {
        const auto began = std::chrono::steady_clock::now();
        runs[j] = run_entry(*group[j], binary, root + "/" + group[j]->name, budgets[j]);
        seconds[j] = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
      });
    }
    for (std::thread& t : threads) t.join();
    for (size_t j = 0; j < group.size(); ++j) {
      const Entry& e = *group[j];
      if (budgets[j] < 0) {
        std::printf("%-32s FAILED: its roomy run %s has no peak\n", e.name.c_str(), e.roomy.c_str());
        ++failed;
        continue;
      }
      results[e.name] = runs[j];
      if (only.empty() || e.name.find(only) != std::string::npos) report(e, runs[j], seconds[j]);
    }
  }

  void report(const Entry& e, const Result& r, double s) {
    ++checked;
    const auto was = expected.find(e.name);
    std::string verdict;
    if (!r.ok) {
      verdict = "FAILED (" + r.log + ")";
      ++failed;
    } else if (was == expected.end()) {
      verdict = "new";
      if (!record) ++differ;
    } else if (was->second.hash == r.hash && was->second.losses == r.losses) {
      verdict = "same";
    } else {
      verdict = "DIFFERENT (recorded " + was->second.hash + " " + was->second.losses + ")";
      if (!record) ++differ;
    }
    std::printf("%-32s %16s %-28s %5.1f s  %s\n", e.name.c_str(), r.hash.c_str(), r.losses.c_str(), s,
                verdict.c_str());
    std::fflush(stdout);
    if (r.ok) out_text += e.name + " " + r.hash + " " + r.losses + "\n";
  }
};

// The entries --only selects (all without it), with the roomy runs their budgets come from;
// bf16's skipped, and said so, without AVX-512.
std::vector<const Entry*> selected(const std::vector<Entry>& all, const std::string& only, bool avx512) {
  std::vector<const Entry*> list;
  for (const Entry& e : all) {
    bool needed = only.empty() || e.name.find(only) != std::string::npos;
    for (const Entry& other : all) needed = needed || (other.roomy == e.name && other.name.find(only) != std::string::npos);
    if (!needed) continue;
    if (bf16_entry(e) && !avx512) {
      if (only.empty() || e.name.find(only) != std::string::npos)
        std::printf("%-32s skipped: bf16 takes other kernels without AVX-512\n", e.name.c_str());
      continue;
    }
    list.push_back(&e);
  }
  return list;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: bit_matrix HYBRID_TRAIN FIXTURE [--record] [--only SUBSTRING] [--keep DIR]\n");
    return 2;
  }
  const std::string binary = argv[1], fixture = argv[2];
  bool record = false;
  std::string only, keep;
  for (int i = 3; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--record") {
      record = true;
    } else if (arg == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else if (arg == "--keep" && i + 1 < argc) {
      keep = argv[++i];
    } else {
      std::fprintf(stderr, "bit_matrix: argument %s: unknown; see the usage in tests/training/bit_matrix.cpp\n",
                   arg.c_str());
      return 2;
    }
  }
  // The kernels' instruction sets, pinned (see the top of this file); inherited by every rank.
  setenv("ATEN_CPU_CAPABILITY", "avx2", 1);
  setenv("OPENBLAS_CORETYPE", "Haswell", 1);
  const bool avx512 = ht::test::cpu_has_avx512_core();
  const std::string root = !keep.empty() ? keep
                                         : (std::filesystem::temp_directory_path() /
                                            ("ht_bit_matrix_" + std::to_string(getpid()))).string();
  const std::map<std::string, Recorded> expected = read_fixture(fixture);
  Matrix m{binary, root, record, expected};
  const std::vector<Entry> all = entries();
  const std::vector<const Entry*> list = selected(all, only, avx512);
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < list.size();) {
    // One-rank runs two at a time (each trains on one thread), where the second does not take its
    // budget from the first; runs of several ranks alone.
    const Entry& e = *list[i];
    const bool pair = e.ranks == 1 && i + 1 < list.size() && list[i + 1]->ranks == 1 && list[i + 1]->roomy != e.name &&
                      bf16_entry(*list[i + 1]) == bf16_entry(e);
    m.run(only, pair ? std::vector<const Entry*>{&e, list[i + 1]} : std::vector<const Entry*>{&e});
    i += pair ? 2 : 1;
  }
  const int differ = m.differ, failed = m.failed, checked = m.checked;
  const std::string out_text = m.out_text;
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("bit_matrix: %d entries in %.0f s: %d differ, %d failed\n", checked, total, differ, failed);
  if (record) {
    if (failed > 0 || !only.empty() || !avx512) {
      std::fprintf(stderr, "bit_matrix: --record writes the whole matrix, every entry passing: not written\n");
      return 1;
    }
    std::ofstream(fixture) << "# tests/training/bit_matrix.cpp: entry, FNV-1a of the final checkpoint's model, the "
                              "losses of each step\n"
                           << "# libtorch " << TORCH_VERSION << ", ATen AVX2, OpenBLAS Haswell, oneDNN AVX2 (fp32), AVX512_CORE (bf16)\n"
                           << out_text;
    std::printf("bit_matrix: recorded %s\n", fixture.c_str());
  }
  if (keep.empty()) ht::remove_tree(root);
  return differ + failed > 0 ? 1 : 0;
}

// The training loop: a run stopped at step N and resumed is bit-identical to an uninterrupted
// one; outputs are written as documented; schedule, clipping and accumulation behave.
#include "launcher/config/config_text.h"
#include "launcher/job.h"
#include "training/optimizer.h"
#include "base/user_error.h"
#include "alloc/cpu_device_allocator.h"
#include "tests/support/run_records.h"
#include "tests/support/temp_dir.h"

#include <gmock/gmock.h>

#include <torch/optim/sgd.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <regex>
#include <fstream>
#include <thread>

namespace ht::test {
namespace {

using ::testing::HasSubstr;

std::vector<at::Tensor> state_of(const Model& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.detach().clone());
  for (const auto& b : m.buffers()) out.push_back(b.clone());
  return out;
}

// 64 samples, batch 16: 4 steps per epoch, so a resume at step 3 continues across an epoch.
const char* kBase = R"([data]
dataset = "synthetic"
synthetic_samples = 64
synthetic_eval_samples = 16
synthetic_shape = [3, 8, 8]
synthetic_classes = 4
[training]
steps = 7
global_batch_size = 16
warmup_steps = 2
[checkpoint]
keep = 5
)";

struct ResumeCase {
  const char* name;
  const char* model;                // the [model] section
  std::vector<std::string> extra;  // overrides
};

class Resume : public ::testing::TestWithParam<ResumeCase> {};

TEST_P(Resume, StoppedAndResumedEqualsUninterrupted) {
  TempDir dir;
  const std::string toml = std::string(kBase) + GetParam().model;
  auto args = [&](std::vector<std::string> a) {
    a.insert(a.end(), GetParam().extra.begin(), GetParam().extra.end());
    return a;
  };
  const JobOutcome uninterrupted = run_job(config_for(dir, toml, args({"--job.output_dir=" + dir.path("whole")})), true);

  const std::string out = "--job.output_dir=" + dir.path("parts");
  run_job(config_for(dir, toml, args({out, "--training.steps=3", "--checkpoint.interval=3"})), true);
  const JobOutcome resumed = run_job(
      config_for(dir, toml, args({out, "--checkpoint.resume=latest", "--checkpoint.interval=3"})), true);
  EXPECT_EQ(resumed.result.resumed_from_step, 3);
  EXPECT_EQ(resumed.result.steps, 7);

  const auto a = state_of(*uninterrupted.model), b = state_of(*resumed.model);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].equal(b[i])) << "parameter/buffer " << i;
  EXPECT_EQ(uninterrupted.result.final_loss, resumed.result.final_loss);
}

INSTANTIATE_TEST_SUITE_P(
    Models, Resume,
    ::testing::Values(
        ResumeCase{"convnet_sgd_dropout_batchnorm",
                   "[model]\nname = \"convnet\"\nchannels = [4]\nfc_hidden = 8\ndropout = 0.3\n", {}},
        ResumeCase{"supernet_dynamic_graph", "[model]\nname = \"supernet\"\nwidth = 4\nnum_blocks = 2\n", {}},
        ResumeCase{"gpt_adamw_dropout",
                   "[model]\nname = \"gpt\"\nn_layer = 1\nn_head = 2\nn_embd = 8\nblock_size = 8\ndropout = 0.2\n",
                   {"--training.optimizer=adamw", "--training.lr=0.01"}},
        // Kept 16-bit weight copies are made again from the read weights: the first step after
        // the resume casts (the copies' block is laid out after it), the rest read copies.
        ResumeCase{"gpt_bf16_kept_weight_copies",
                   "[model]\nname = \"gpt\"\nn_layer = 1\nn_head = 2\nn_embd = 8\nblock_size = 8\n",
                   {"--training.optimizer=adamw", "--training.lr=0.01", "--training.mixed_precision=bf16",
                    "--training.compute_weights=kept", "--training.micro_batch_size=8"}},
        // bf16 gradients (two micro-batches a step, the second added into the bf16 block): a
        // checkpoint holds no gradient, so the resumed steps are the uninterrupted ones.
        ResumeCase{"gpt_bf16_gradients",
                   "[model]\nname = \"gpt\"\nn_layer = 1\nn_head = 2\nn_embd = 8\nblock_size = 8\n",
                   {"--training.optimizer=adamw", "--training.lr=0.01", "--training.mixed_precision=bf16",
                    "--training.gradient_dtype=bf16", "--training.micro_batch_size=8", "--training.grad_clip=0.5"}},
        // AdamW's moments in bf16 are written and read in bf16, and go on from there.
        ResumeCase{"gpt_bf16_moments",
                   "[model]\nname = \"gpt\"\nn_layer = 1\nn_head = 2\nn_embd = 8\nblock_size = 8\n",
                   {"--training.optimizer=adamw", "--training.lr=0.01", "--training.optimizer_state_dtype=bf16"}}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Training, DamagedLatestCheckpointFallsBackAndStillMatches) {
  TempDir dir;
  const std::string toml = std::string(kBase) + "[model]\nname = \"mlp\"\nhidden = [8]\ndropout = 0.1\n";
  const JobOutcome whole = run_job(config_for(dir, toml, {"--job.output_dir=" + dir.path("whole")}), true);
  const std::string out = "--job.output_dir=" + dir.path("parts");
  run_job(config_for(dir, toml, {out, "--training.steps=6", "--checkpoint.interval=3"}), true);
  std::filesystem::resize_file(dir.path("parts/checkpoints/step_00000006/model.pt"), 100);  // damage the newest
  const JobOutcome resumed =
      run_job(config_for(dir, toml, {out, "--checkpoint.resume=latest", "--checkpoint.interval=3"}), true);
  EXPECT_EQ(resumed.result.resumed_from_step, 3);
  const auto a = state_of(*whole.model), b = state_of(*resumed.model);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].equal(b[i]));
}

TEST(Training, WritesResolvedConfigMetricsAndSummary) {
  TempDir dir;
  const std::string toml = std::string(kBase) + "[model]\nname = \"mlp\"\n[metrics]\nlog_interval = 2\n";
  Config c = config_for(dir, toml, {"--job.output_dir=" + dir.path("out")});
  run_job(c, true);
  // The resolved config loads back to the config as run: with parallel.data_parallel = 0 ("all
  // ranks") resolved to the ranks there were.
  EXPECT_EQ(c.parallel.data_parallel, 0);
  c.parallel.data_parallel = 1;
  const Config again = load_config(dir.path("out/config.resolved.toml"), {}).config;
  EXPECT_EQ(resolved_toml(again).substr(resolved_toml(again).find('\n')),
            resolved_toml(c).substr(resolved_toml(c).find('\n')));
  std::ifstream metrics(dir.path("out/metrics.jsonl"));
  std::string line, train_line, eval_line;
  int train = 0, eval = 0;
  while (std::getline(metrics, line)) {
    if (line.find("\"event\": \"train\"") != std::string::npos) {
      ++train;
      train_line = line;
    }
    if (line.find("\"event\": \"eval\"") != std::string::npos) {
      ++eval;
      eval_line = line;
    }
  }
  EXPECT_EQ(train, 4) << "steps 2, 4, 6 and the last (7)";
  EXPECT_EQ(eval, 2) << "after the epoch (step 4) and at the end";
  for (const char* key : {"\"step\"", "\"loss\"", "\"lr\"", "\"step_ms\"", "\"samples_per_s\"", "\"mem_peak_bytes\""})
    EXPECT_THAT(train_line, HasSubstr(key));
  for (const char* key : {"\"eval_loss\"", "\"eval_accuracy\"", "\"eval_samples\": 16", "\"eval_s\""})
    EXPECT_THAT(eval_line, HasSubstr(key));
  std::ifstream summary(dir.path("out/summary.json"));
  const std::string s((std::istreambuf_iterator<char>(summary)), std::istreambuf_iterator<char>());
  for (const char* key : {"\"final_loss\"", "\"eval_accuracy\"", "\"mem_peak_bytes\"", "\"wall_s\""})
    EXPECT_THAT(s, HasSubstr(key));
}

// A ResNet-18 on 28x28 images, narrow enough to be quick: activations dominate its memory.
const char* kResNet = R"([model]
name = "resnet"
width = 8
[data]
dataset = "synthetic"
synthetic_samples = 96
synthetic_eval_samples = 16
synthetic_shape = [1, 28, 28]
[training]
steps = 3
global_batch_size = 32
eval_batches = 1
[metrics]
log_interval = 1
)";

TEST(Training, DtrUnderABudgetTrainsToTheSameParameters) {
  TempDir dir;
  // The device memory this job takes without eviction, measured in a budget it never fills.
  const JobOutcome roomy = run_job(config_for(dir, kResNet, {"--job.output_dir=" + dir.path("roomy"),
                                                              "--memory.budget=1GiB"}), true);
  const int64_t peak = roomy.result.mem_peak_bytes;
  ASSERT_GT(peak, 0);
  const std::string budget = std::to_string(peak * 7 / 10);
  const JobOutcome plain = run_job(config_for(dir, kResNet, {"--job.output_dir=" + dir.path("plain")}), true);
  const JobOutcome dtr = run_job(config_for(dir, kResNet, {"--job.output_dir=" + dir.path("dtr"),
                                                            "--memory.policy=dtr", "--memory.budget=" + budget}), true);
  const auto a = state_of(*plain.model), b = state_of(*dtr.model), c = state_of(*roomy.model);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(a[i].equal(b[i])) << "parameter/buffer " << i;
    EXPECT_TRUE(a[i].equal(c[i])) << "parameter/buffer " << i;
  }
  EXPECT_LE(dtr.result.mem_peak_bytes, peak * 7 / 10);
  // Every train record carries the memory manager's numbers, per step.
  const std::string metrics = read_file(dir.path("dtr/metrics.jsonl"));
  for (const char* key : {"\"mem_budget_bytes\": " , "\"evictions\"", "\"recomputations\"", "\"recompute_ms\"",
                          "\"fragmentation\"", "\"mem_peak_bytes\""})
    EXPECT_THAT(metrics, HasSubstr(key));
  const int64_t capacity = (std::stoll(budget) + 63) / 64 * 64;  // the arena rounds to its alignment
  EXPECT_THAT(metrics, HasSubstr("\"mem_budget_bytes\": " + std::to_string(capacity)));
  EXPECT_THAT(read_file(dir.path("plain/metrics.jsonl")), HasSubstr("\"evictions\": 0"));
  // The budget was real: the run evicted (and so recomputed) to stay in it.
  EXPECT_TRUE(std::regex_search(metrics, std::regex("\"evictions\": [1-9]"))) << metrics;
  EXPECT_TRUE(std::regex_search(metrics, std::regex("\"recomputations\": [1-9]"))) << metrics;
}

// memory.policy = "full": every block but the last keeps only its output in forward, and DTR
// recomputes the rest where its backward reads it, dropout's masks included (drawn from each op's
// seed): the same parameters bit for bit, in less memory.
TEST(Training, FullRecomputationTrainsTheSameParametersInLessMemory) {
  TempDir dir;
  const std::string gpt = std::string(kBase) +
                          "[model]\nname = \"gpt\"\nn_layer = 4\nn_head = 2\nn_embd = 16\nblock_size = 16\ndropout = 0.2\n";
  const std::vector<std::string> adamw{"--training.optimizer=adamw", "--training.lr=0.01", "--memory.budget=1GiB"};
  auto with = [&](std::vector<std::string> a) {
    a.insert(a.end(), adamw.begin(), adamw.end());
    return a;
  };
  const JobOutcome plain = run_job(config_for(dir, gpt, with({"--job.output_dir=" + dir.path("plain")})), true);
  const JobOutcome full =
      run_job(config_for(dir, gpt, with({"--job.output_dir=" + dir.path("full"), "--memory.policy=full"})), true);
  const auto a = state_of(*plain.model), b = state_of(*full.model);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].equal(b[i])) << "parameter/buffer " << i;
  EXPECT_EQ(plain.result.final_loss, full.result.final_loss);
  EXPECT_LT(full.result.mem_peak_bytes, plain.result.mem_peak_bytes);
  const std::string metrics = read_file(dir.path("full/metrics.jsonl"));
  EXPECT_TRUE(std::regex_search(metrics, std::regex("\"recomputations\": [1-9]"))) << metrics;
}

// memory.policy = "per_block": each block keeps what its solved plan keeps (a share of what its
// backward reads, or bytes) and DTR regenerates the rest, dropout's masks included: the same
// parameters bit for bit, in less memory than without, and fewer regenerations than full's.
TEST(Training, PerBlockPlansTrainTheSameParametersBetweenNoneAndFull) {
  TempDir dir;
  const std::string gpt = std::string(kBase) +
                          "[model]\nname = \"gpt\"\nn_layer = 4\nn_head = 2\nn_embd = 16\nblock_size = 16\ndropout = 0.2\n";
  auto job = [&](const std::string& out, std::vector<std::string> a) {
    a.insert(a.end(), {"--training.optimizer=adamw", "--training.lr=0.01", "--memory.budget=1GiB",
                       "--job.output_dir=" + dir.path(out)});
    return run_job(config_for(dir, gpt, a), true);
  };
  const JobOutcome plain = job("plain", {});
  const JobOutcome full = job("full", {"--memory.policy=full"});
  const auto a = state_of(*plain.model);
  auto regenerations = [&](const std::string& out) {
    std::smatch m;
    const std::string metrics = read_file(dir.path(out + "/metrics.jsonl"));
    EXPECT_TRUE(std::regex_search(metrics, m, std::regex("\"recomputations\": ([0-9]+)"))) << metrics;
    return m.empty() ? 0 : std::stoll(m[1]);
  };
  const std::vector<std::string> keeps{"50%", "75%", "20KiB"};
  for (size_t k = 0; k < keeps.size(); ++k) {
    const std::string& keep = keeps[k];
    const std::string out = "per_block_" + std::to_string(k);
    const JobOutcome per_block = job(out, {"--memory.policy=per_block", "--memory.block_keep=" + keep});
    const auto b = state_of(*per_block.model);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].equal(b[i])) << keep << ": parameter/buffer " << i;
    EXPECT_EQ(plain.result.final_loss, per_block.result.final_loss) << keep;
    EXPECT_LT(per_block.result.mem_peak_bytes, plain.result.mem_peak_bytes) << keep;
    EXPECT_GE(per_block.result.mem_peak_bytes, full.result.mem_peak_bytes) << keep;
    EXPECT_LT(regenerations(out), regenerations("full")) << keep;
  }
}

// memory.block_offload: each block's plan offloads to host what the link hides (copied out as the
// next block runs, dropped once copied, brought back before its backward), keeps nothing on the
// device ("0%") and regenerates the rest: the same parameters bit for bit, in less memory than
// without, with fewer regenerations than full recomputation's.
TEST(Training, PerBlockOffloadTrainsTheSameParametersWithFewerRegenerations) {
  TempDir dir;
  // 8 sequences of 64 tokens of 64 floats: values of 128 KiB and more, the link's time worth it.
  const std::string gpt = std::string(kBase) +
                          "[model]\nname = \"gpt\"\nn_layer = 3\nn_head = 2\nn_embd = 64\nblock_size = 64\ndropout = 0.2\n";
  auto job = [&](const std::string& out, std::vector<std::string> a) {
    a.insert(a.end(), {"--training.optimizer=adamw", "--training.lr=0.01", "--memory.budget=1GiB",
                       "--training.global_batch_size=8", "--job.output_dir=" + dir.path(out)});
    return run_job(config_for(dir, gpt, a), true);
  };
  const JobOutcome plain = job("plain", {});
  const JobOutcome full = job("full", {"--memory.policy=full"});
  const JobOutcome offload = job("offload", {"--memory.policy=per_block", "--memory.block_keep=0%",
                                             "--memory.block_offload=true", "--memory.host_budget=256MiB"});
  const auto a = state_of(*plain.model), b = state_of(*offload.model);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].equal(b[i])) << "parameter/buffer " << i;
  EXPECT_EQ(plain.result.final_loss, offload.result.final_loss);
  EXPECT_LT(offload.result.mem_peak_bytes, plain.result.mem_peak_bytes);
  auto counter = [&](const std::string& out, const std::string& key) {
    std::smatch m;
    const std::string metrics = read_file(dir.path(out + "/metrics.jsonl"));
    EXPECT_TRUE(std::regex_search(metrics, m, std::regex("\"" + key + "\": ([0-9]+)"))) << key << ": " << metrics;
    return m.empty() ? 0 : std::stoll(m[1]);
  };
  EXPECT_GT(counter("offload", "swap_out_bytes"), 0);
  EXPECT_LT(counter("offload", "recomputations"), counter("full", "recomputations"));
  EXPECT_EQ(read_file(dir.path("offload/config.resolved.toml")).find("policy = \"full\""), std::string::npos)
      << "keeping 0% with offload stays per_block";
}

// A Llama block's attention saves transposes (views) of rope's and contiguous's outputs: offloaded
// and dropped with the block, those outputs come back by their copies, never by running the QKV
// product again (their copies were discarded as unused until 2026-12-04: 72 regenerations a step
// on Llama-6L). Every byte copied out comes back in, and the parameters are the roomy run's.
TEST(Training, PerBlockOffloadBringsBackWhatSavedViewsRead) {
  TempDir dir;
  const std::string llama = R"([model]
name = "llama"
n_layer = 2
n_head = 4
n_kv_heads = 2
n_embd = 64
multiple_of = 32
block_size = 64
vocab_size = 128
[data]
dataset = "synthetic"
synthetic_samples = 64
synthetic_eval_samples = 16
synthetic_shape = [64]
synthetic_classes = 128
[training]
steps = 3
global_batch_size = 8
[metrics]
log_interval = 1
)";
  auto job = [&](const std::string& out, std::vector<std::string> a) {
    a.insert(a.end(), {"--memory.budget=1GiB", "--job.output_dir=" + dir.path(out)});
    return run_job(config_for(dir, llama, a), true);
  };
  const JobOutcome plain = job("plain", {});
  const JobOutcome offload = job("offload", {"--memory.policy=per_block", "--memory.block_keep=0%",
                                             "--memory.block_offload=true", "--memory.host_budget=256MiB"});
  const auto a = state_of(*plain.model), b = state_of(*offload.model);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].equal(b[i])) << "parameter/buffer " << i;
  const double out = last_train_number(dir.path("offload/metrics.jsonl"), "swap_out_bytes");
  EXPECT_GT(out, 0);
  EXPECT_EQ(last_train_number(dir.path("offload/metrics.jsonl"), "swap_in_bytes"), out)
      << "every byte offloaded comes back by its copy";
}

// memory.plan_first_step (the default under static plans): the job's micro-batch is traced on
// meta tensors and planned before the first step, with the optimizer's state it holds from the
// second step on, so every micro-batch, the first included, runs on that one plan (no second
// solve when the state appears, every block at its planned offset from the second step), and the
// parameters are the run with room's bit for bit, dropout's masks recomputed included. Without it
// the first micro-batch runs under DTR and is planned from.
TEST(Training, TheFirstStepRunsOnAPlanMadeBeforeIt) {
  TempDir dir;
  const std::string gpt = std::string(kBase) +
                          "[model]\nname = \"gpt\"\nn_layer = 4\nn_head = 2\nn_embd = 16\nblock_size = 16\ndropout = 0.2\n";
  auto job = [&](const std::string& out, std::vector<std::string> a) {
    a.insert(a.end(), {"--training.optimizer=adamw", "--training.lr=0.01", "--metrics.log_interval=1", "--training.micro_batch_size=8",
                       "--job.output_dir=" + dir.path(out)});
    return run_job(config_for(dir, gpt, a), true);
  };
  const JobOutcome roomy = job("roomy", {"--memory.budget=1GiB"});
  const std::string tight = "--memory.budget=" + std::to_string(roomy.result.mem_peak_bytes * 7 / 10);
  const JobOutcome ahead = job("ahead", {tight, "--memory.policy=static", "--memory.solve_time_s=0"});
  const JobOutcome captured =
      job("captured", {tight, "--memory.policy=static", "--memory.solve_time_s=0", "--memory.plan_first_step=false"});
  const auto a = state_of(*roomy.model);
  for (const JobOutcome* run : {&ahead, &captured}) {
    const auto b = state_of(*run->model);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].equal(b[i])) << "parameter/buffer " << i;
    EXPECT_EQ(roomy.result.final_loss, run->result.final_loss);
  }
  const std::string metrics = dir.path("ahead/metrics.jsonl");
  const std::vector<double> hits = train_numbers(metrics, "plan_hits");
  ASSERT_FALSE(hits.empty());
  for (size_t step = 0; step < hits.size(); ++step) EXPECT_EQ(hits[step], 2.0 * (step + 1)) << "two micro-batches a step";
  EXPECT_EQ(last_train_number(metrics, "plans_ahead"), 1);
  EXPECT_EQ(last_train_number(metrics, "plans"), 1) << "the optimizer's state was planned for";
  EXPECT_GT(last_train_number(metrics, "plan_evictions"), 0) << "the budget made the plan drop values";
  EXPECT_EQ(last_train_number(metrics, "layout_misses"), 0);
  EXPECT_EQ(last_train_number(metrics, "evictions"), 0) << "DTR, the safety net, never had to act";
  const std::string late = dir.path("captured/metrics.jsonl");
  EXPECT_EQ(train_numbers(late, "plan_hits").front(), 1) << "the first micro-batch ran under DTR";
  EXPECT_EQ(last_train_number(late, "plans_ahead"), 0);
}

// Every train record's `"key": N`, in order.
std::vector<std::string> per_step(const std::string& metrics, const std::string& key) {
  std::vector<std::string> out;
  const std::regex number("\"" + key + "\": ([0-9]+)");
  for (auto it = std::sregex_iterator(metrics.begin(), metrics.end(), number); it != std::sregex_iterator(); ++it) {
    out.push_back((*it)[1]);
  }
  return out;
}

// memory.kernel_costs = "modeled" (the default): DTR weighs a model of each kernel's work, not its
// time, so a run on a busy machine evicts, recomputes and places exactly what the same run on an
// idle one does, and a budget that trained once trains again. Two threads spin beside the second
// run; nothing here depends on how much they slow it down.
TEST(Training, DtrDecidesTheSameOnABusyMachine) {
  TempDir dir;
  const JobOutcome roomy = run_job(config_for(dir, kResNet, {"--job.output_dir=" + dir.path("roomy"),
                                                              "--memory.budget=1GiB"}), true);
  const std::string budget = "--memory.budget=" + std::to_string(roomy.result.mem_peak_bytes * 6 / 10);
  run_job(config_for(dir, kResNet, {"--job.output_dir=" + dir.path("idle"), "--memory.policy=dtr", budget}), true);
  std::atomic<bool> stop{false};
  std::vector<std::thread> spinners;
  for (int i = 0; i < 2; ++i) {
    spinners.emplace_back([&stop] {
      volatile double x = 1;
      while (!stop.load(std::memory_order_relaxed)) x = x * 1.0000001 + 1e-9;
    });
  }
  run_job(config_for(dir, kResNet, {"--job.output_dir=" + dir.path("busy"), "--memory.policy=dtr", budget}), true);
  stop = true;
  for (std::thread& t : spinners) t.join();
  const std::string idle = read_file(dir.path("idle/metrics.jsonl")), busy = read_file(dir.path("busy/metrics.jsonl"));
  for (const char* key : {"evictions", "recomputations", "mem_peak_bytes"}) {
    const std::vector<std::string> a = per_step(idle, key), b = per_step(busy, key);
    EXPECT_FALSE(a.empty()) << key;
    EXPECT_EQ(a, b) << key << " per step";
  }
  EXPECT_TRUE(std::regex_search(idle, std::regex("\"evictions\": [1-9]"))) << "the budget made DTR evict";
}

// Freed host memory kept for reuse (memory.host_cache) changes where tensors live, never a bit.
TEST(Training, HostMemoryCacheChangesNoBit) {
  TempDir dir;
  const JobOutcome kept = run_job(config_for(dir, kResNet, {"--job.output_dir=" + dir.path("kept")}), true);
  EXPECT_TRUE(host_memory_caching()) << "on by default";
  const JobOutcome returned = run_job(config_for(dir, kResNet, {"--job.output_dir=" + dir.path("returned"),
                                                                "--memory.host_cache=false"}), true);
  EXPECT_FALSE(host_memory_caching());
  const auto a = state_of(*kept.model), b = state_of(*returned.model);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].equal(b[i])) << "parameter/buffer " << i;
  EXPECT_EQ(kept.result.final_loss, returned.result.final_loss);
  set_host_memory_caching(true);
}

// training.channels_last stores convolution weights NHWC: the same training up to summation
// order, and a hint in the one error where it costs memory.
TEST(Training, ChannelsLastIsALayoutNotAnotherComputation) {
  TempDir dir;
  // One step: later steps amplify fp32 rounding through batch norm on 32 samples.
  const JobOutcome nhwc = run_job(config_for(dir, kResNet, {"--job.output_dir=" + dir.path("nhwc"),
                                                            "--training.steps=1"}), true);
  const JobOutcome nchw = run_job(config_for(dir, kResNet, {"--job.output_dir=" + dir.path("nchw"),
                                                            "--training.steps=1", "--training.channels_last=false"}),
                                  true);
  int convolutions = 0;
  for (const at::Tensor& p : nhwc.model->parameters()) {
    if (p.dim() != 4) continue;
    ++convolutions;
    EXPECT_TRUE(p.is_contiguous(at::MemoryFormat::ChannelsLast));
    EXPECT_EQ(p.stride(1), 1) << "channels innermost, the stem's single input channel too";
  }
  EXPECT_GT(convolutions, 0);
  const auto a = state_of(*nhwc.model), b = state_of(*nchw.model);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].is_floating_point()) {
      EXPECT_TRUE(at::allclose(a[i], b[i], 1e-4, 1e-4)) << "parameter/buffer " << i << ": " << (a[i] - b[i]).abs().max().item<double>() << " of " << b[i].abs().max().item<double>();
    } else {
      EXPECT_TRUE(a[i].equal(b[i])) << "buffer " << i;
    }
  }
  const JobOutcome roomy = run_job(config_for(dir, kResNet, {"--job.output_dir=" + dir.path("roomy"),
                                                              "--memory.budget=1GiB"}), true);
  const std::string tight = "--memory.budget=" + std::to_string(roomy.result.mem_peak_bytes * 4 / 10);
  for (const char* layout : {"true", "false"}) {
    try {
      run_job(config_for(dir, kResNet, {"--job.output_dir=" + dir.path("tight"), tight, "--memory.policy=none",
                                        std::string("--training.channels_last=") + layout}), true);
      ADD_FAILURE() << "40% of the peak without eviction must be refused";
    } catch (const UserError& e) {
      EXPECT_THAT(e.what(), HasSubstr("does not fit memory.budget"));
      EXPECT_EQ(std::string(e.what()).find("training.channels_last = false can help") != std::string::npos,
                std::string(layout) == "true");
    }
  }
}

// Issue 4's "done when": configs/resnet18_fmnist.toml trains with DTR in 30% of its peak to the
// parameters of the run without DTR. In one pass of 128 it cannot: parameters, gradients and
// momentum alone take 128 MiB of the 179, and one convolution's backward at 128 x 64 x 28 x 28
// reads and writes 77 MiB (the program says so, and to lower micro_batch_size); in micro-batches of
// 32 it does.
TEST(Training, ResNet18FashionMnistTrainsInThirtyPercentOfItsPeak) {
  TempDir dir;
  auto config = [&](const std::string& out, std::vector<std::string> args) {
    std::vector<ConfigOverride> overrides;
    args.push_back("--job.output_dir=" + dir.path(out));
    for (const auto& a : args) overrides.push_back(override_of(a));
    return load_config(std::string(HT_SOURCE_DIR) + "/configs/resnet18_fmnist.toml", overrides).config;
  };
  const std::vector<std::string> common{"--training.steps=1", "--training.eval_batches=1", "--training.channels_last=false"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.end(), common.begin(), common.end());
    return more;
  };
  const int64_t peak = run_job(config("roomy", with({"--memory.budget=1GiB"})), true).result.mem_peak_bytes;
  const std::string budget = std::to_string(peak * 3 / 10);
  EXPECT_THROW(run_job(config("whole", with({"--memory.policy=dtr", "--memory.budget=" + budget})), true), UserError)
      << "one pass of 128 cannot fit";
  const JobOutcome plain = run_job(config("plain", with({"--training.micro_batch_size=32"})), true);
  const JobOutcome dtr = run_job(config("dtr", with({"--training.micro_batch_size=32", "--memory.policy=dtr",
                                                     "--memory.budget=" + budget})), true);
  const auto a = state_of(*plain.model), b = state_of(*dtr.model);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].equal(b[i])) << "parameter/buffer " << i;
  EXPECT_LE(dtr.result.mem_peak_bytes, peak * 3 / 10 + 64);
  EXPECT_TRUE(std::regex_search(read_file(dir.path("dtr/metrics.jsonl")), std::regex("\"evictions\": [1-9]")))
      << "at 30% of the peak the run must have evicted";
}

TEST(Training, MemoryTraceIsAChromeTraceOfTheFirstSteps) {
  TempDir dir;
  const JobOutcome roomy = run_job(config_for(dir, kResNet, {"--job.output_dir=" + dir.path("roomy"),
                                                              "--memory.budget=1GiB"}), true);
  const std::string budget = std::to_string(roomy.result.mem_peak_bytes * 7 / 10);
  run_job(config_for(dir, kResNet, {"--job.output_dir=" + dir.path("out"), "--memory.policy=megengine",
                                     "--memory.budget=" + budget, "--memory.trace=true", "--memory.trace_steps=1"}),
          true);
  const std::string trace = read_file(dir.path("out/memory_trace.json"));
  EXPECT_THAT(trace, HasSubstr("\"traceEvents\""));
  for (const char* event : {"\"step 1\"", "\"cat\":\"kernel\"", "\"cat\":\"recompute\"", "\"cat\":\"evict\"",
                            "\"name\":\"alloc\"", "\"name\":\"free\"", "\"device memory\""})
    EXPECT_THAT(trace, HasSubstr(event));
  EXPECT_THAT(trace, ::testing::Not(HasSubstr("\"step 2\""))) << "trace_steps = 1";
  EXPECT_FALSE(std::filesystem::exists(dir.path("out/memory_trace.json.tmp")));
}

// metrics.time_by_op: the run's kernel times by op, regenerations apart, in one record at the end
// (after a short run's first step); timing every kernel changes no bit of what DTR trains.
TEST(Training, TimeByOpLogsEveryKernelAndChangesNothing) {
  TempDir dir;
  const JobOutcome roomy = run_job(config_for(dir, kResNet, {"--job.output_dir=" + dir.path("roomy"),
                                                              "--memory.budget=1GiB"}), true);
  const std::string budget = "--memory.budget=" + std::to_string(roomy.result.mem_peak_bytes * 7 / 10);
  const JobOutcome plain = run_job(config_for(dir, kResNet, {"--job.output_dir=" + dir.path("plain"),
                                                              "--memory.policy=dtr", budget}), true);
  const JobOutcome timed = run_job(config_for(dir, kResNet, {"--job.output_dir=" + dir.path("timed"),
                                                              "--memory.policy=dtr", budget,
                                                              "--metrics.time_by_op=true"}), true);
  const auto a = state_of(*plain.model), b = state_of(*timed.model);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].equal(b[i])) << "parameter " << i;
  const std::string metrics = read_file(dir.path("timed/metrics.jsonl"));
  for (const char* key : {"\"event\": \"time_by_op\", \"first_step\": 2, \"steps\": 2", "\"kernel_ms_per_step\"",
                          "\"conv2d\"", "\"conv2d backward\"", " recomputed\""})
    EXPECT_THAT(metrics, HasSubstr(key));
  EXPECT_THAT(read_file(dir.path("plain/metrics.jsonl")), ::testing::Not(HasSubstr("time_by_op")));
}

// Host swap as users run it: hybrid_train with memory.policy = "swap" and "hybrid" at 0.7 of the
// unbudgeted peak trains the unbudgeted run's parameters, logs what crossed the link each step,
// and the memory trace shows the copies (out and in) beside compute.
TEST(Training, HostSwapTrainsTheSameParametersAndTracesItsCopies) {
  TempDir dir;
  const JobOutcome roomy = run_job(config_for(dir, kResNet, {"--job.output_dir=" + dir.path("roomy"),
                                                              "--memory.budget=1GiB"}), true);
  const std::string budget = std::to_string(roomy.result.mem_peak_bytes * 7 / 10);
  for (const char* policy : {"swap", "hybrid"}) {
    const std::string out = dir.path(policy);
    const JobOutcome run = run_job(config_for(dir, kResNet, {"--job.output_dir=" + out, std::string("--memory.policy=") + policy,
                                                             "--memory.budget=" + budget, "--memory.host_link_gbps=50",
                                                             "--memory.trace=true", "--memory.trace_steps=2"}), true);
    const auto a = state_of(*roomy.model), b = state_of(*run.model);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].equal(b[i])) << policy << ": parameter/buffer " << i;
    const std::string metrics = read_file(out + "/metrics.jsonl");
    for (const char* key : {"\"swap_in_bytes\"", "\"swap_in_hidden_bytes\"", "\"swap_wait_ms\"", "\"host_peak_bytes\""})
      EXPECT_THAT(metrics, HasSubstr(key)) << policy;
    EXPECT_TRUE(std::regex_search(metrics, std::regex("\"swap_out_bytes\": [1-9]"))) << policy << ": " << metrics;
    const std::string trace = read_file(out + "/memory_trace.json");
    EXPECT_THAT(trace, HasSubstr("\"cat\":\"swap_out\"")) << policy;
    if (std::string(policy) == "swap") {
      EXPECT_THAT(trace, HasSubstr("\"cat\":\"swap_in\""));
    }
  }
}

// memory.compress = "lossless": every relu keeps a 1-bit mask for backward instead of its output.
// The MLP's relu feeds dropout, which saves nothing of it: the output goes after forward, and the
// parameters are the uncompressed run's bit for bit. "bf16" (under host swap) moves half the bytes
// across the link and trains to nearly the same parameters.
TEST(Training, CompressionKeepsMasksLosslesslyAndHalvesTheLinksBytes) {
  TempDir dir;
  // Activations of 16 x 2048 floats: 128 KiB, above the size host swap copies.
  const std::string toml = std::string(kBase) + "[model]\nname = \"mlp\"\nhidden = [2048, 2048]\ndropout = 0.1\n";
  auto run = [&](const std::string& name, std::vector<std::string> args) {
    args.push_back("--job.output_dir=" + dir.path(name));
    args.push_back("--memory.budget=1GiB");
    return run_job(config_for(dir, toml, args), true);
  };
  const JobOutcome off = run("off", {}), lossless = run("lossless", {"--memory.compress=lossless"});
  const auto a = state_of(*off.model), b = state_of(*lossless.model);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].equal(b[i])) << "parameter/buffer " << i;
  const double held_off = last_train_number(dir.path("off/metrics.jsonl"), "activation_peak_bytes");
  const double held_masks = last_train_number(dir.path("lossless/metrics.jsonl"), "activation_peak_bytes");
  EXPECT_LT(held_masks, held_off) << "relu outputs no longer held for backward";

  // Host swap of the same job, off and bf16: vDNN's rule copies the matmuls' outputs, fp32.
  const std::string budget = "--memory.budget=" + std::to_string(off.result.mem_peak_bytes * 9 / 10);
  const std::vector<std::string> swap{"--memory.policy=swap", budget, "--memory.host_link_gbps=50"};
  auto with = [&](std::vector<std::string> args, const std::string& more) {
    args.push_back(more);
    return args;
  };
  const JobOutcome swapped = run("swap", swap), narrow = run("swap_bf16", with(swap, "--memory.compress=bf16"));
  const double full = last_train_number(dir.path("swap/metrics.jsonl"), "swap_out_bytes");
  const double half = last_train_number(dir.path("swap_bf16/metrics.jsonl"), "swap_out_bytes");
  ASSERT_GT(full, 0);
  EXPECT_NEAR(half / full, 0.5, 0.1) << full << " bytes out, " << half << " as bf16";
  const auto c = state_of(*swapped.model), d = state_of(*narrow.model);
  for (size_t i = 0; i < c.size(); ++i) {
    EXPECT_TRUE(at::allclose(c[i], d[i], 1e-2, 1e-3)) << "bf16's rounding of what was swapped: parameter " << i;
  }
}

// memory.optimizer_state = "host": the state waits on host between optimizer steps (ZeRO-Offload's
// place) and comes back for each step with its bits, so the parameters are those of the run that
// keeps it on the device, and every step moves the whole state out and back over the link.
TEST(Training, OptimizerStateWaitsOnHostAndComesBackWithItsBits) {
  TempDir dir;
  const std::string toml = std::string(kBase) + "[model]\nname = \"mlp\"\nhidden = [256, 256]\n";
  for (const std::string optimizer : {"sgd", "adamw"}) {
    auto run = [&](const std::string& where) {
      return run_job(config_for(dir, toml, {"--job.output_dir=" + dir.path(optimizer + where),
                                            "--training.optimizer=" + optimizer, "--memory.budget=256MiB",
                                            "--memory.policy=hybrid", "--memory.optimizer_state=" + where}),
                     true);
    };
    const JobOutcome device = run("device"), host = run("host");
    const auto a = state_of(*device.model), b = state_of(*host.model);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].equal(b[i])) << optimizer << ": parameter/buffer " << i;
    int64_t parameter_bytes = 0;
    for (const auto& p : host.model->parameters()) parameter_bytes += p.numel() * 4;
    const double state = (optimizer == "sgd" ? 1 : 2) * static_cast<double>(parameter_bytes);  // momentum; AdamW's moments
    const std::string metrics = dir.path(optimizer + "host/metrics.jsonl");
    EXPECT_EQ(last_train_number(metrics, "state_out_bytes"), state) << optimizer;
    EXPECT_EQ(last_train_number(metrics, "state_in_bytes"), state) << optimizer;
  }
}

TEST(Training, AccumulationOfOneMicroBatchIsThePlainRunAndFourIsClose) {
  TempDir dir;
  const std::string toml = std::string(kBase) + "[model]\nname = \"mlp\"\nhidden = [16]\n";
  auto run = [&](const std::string& micro) {
    return state_of(*run_job(config_for(dir, toml, {"--job.output_dir=" + dir.path("m" + micro),
                                                    "--training.micro_batch_size=" + micro}), true).model);
  };
  const auto plain = run("0"), one = run("16"), four = run("4");
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_TRUE(plain[i].equal(one[i]));
    EXPECT_TRUE(at::allclose(plain[i], four[i], 1e-4, 1e-5)) << "fp32 summation order only";
  }
}

// training.compute_weights: kept 16-bit copies (made once per optimizer step) train the bits that
// a cast at every read trains, with accumulation over micro-batches, for a tied GPT (the head and
// the embedding share a weight, whose copy the head's chunks read) and a Llama.
TEST(Training, KeptWeightCopiesTrainTheBitsOfACastAtEveryRead) {
  TempDir dir;
  const std::vector<std::string> models = {
      "[model]\nname = \"gpt\"\nn_layer = 2\nn_head = 2\nn_embd = 16\nblock_size = 8\n",
      "[model]\nname = \"llama\"\nn_layer = 2\nn_head = 4\nn_kv_heads = 2\nn_embd = 16\nblock_size = 8\n"
      "multiple_of = 8\n"};
  for (size_t m = 0; m < models.size(); ++m) {
    const std::string toml = std::string(kBase) + models[m];
    auto run = [&](const std::string& mode) {
      return run_job(config_for(dir, toml, {"--job.output_dir=" + dir.path(mode + std::to_string(m)),
                                            "--training.optimizer=adamw", "--training.lr=0.01",
                                            "--training.mixed_precision=bf16", "--training.micro_batch_size=4",
                                            "--training.compute_weights=" + mode}),
                     true);
    };
    const JobOutcome cast = run("cast"), kept = run("kept");
    const auto a = state_of(*cast.model), b = state_of(*kept.model);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].equal(b[i])) << models[m] << "parameter/buffer " << i;
    const std::string metrics = dir.path("kept" + std::to_string(m)) + "/metrics.jsonl";
    // 2 bytes for every weight a product reads (the tied GPT's head reads its embedding's table;
    // the Llama's is untied): all but the norms' and the embeddings' (docs/memory.md).
    int64_t copied = 0;
    for (const auto& named : kept.model->named_parameters()) {
      const std::string& name = named.key();
      const bool embedding = name.find("wpe") != std::string::npos || (m == 1 && name.find("wte") != std::string::npos);
      if (name.find("norm") == std::string::npos && !embedding) copied += named.value().numel();
    }
    EXPECT_EQ(last_train_number(metrics, "weight_copies_bytes"), static_cast<double>(2 * copied));
    // Each copy once a step, not once in each of 4 micro-batches' forwards: 4 products a block (a
    // GPT's with their biases) and the head.
    EXPECT_EQ(last_train_number(metrics, "weight_copies_made"), m == 0 ? 2 * 4 * 2 + 1 : 2 * 4 + 1);
    EXPECT_TRUE(train_numbers(dir.path("cast" + std::to_string(m)) + "/metrics.jsonl", "weight_copies_bytes").empty());
  }
}

TEST(Training, Bf16OnFashionMnistReachesTheAccuracyOfFp32) {
  TempDir dir;
  const std::string toml = R"([model]
name = "convnet"
channels = [8, 16]
fc_hidden = 32
[data]
dataset = "fashion_mnist"
[training]
steps = 120
global_batch_size = 64
lr = 0.05
eval_batches = 40
)";
  auto run = [&](const std::string& precision) {
    return run_job(config_for(dir, toml, {"--job.output_dir=" + dir.path(precision),
                                          "--training.mixed_precision=" + precision}), true);
  };
  const JobOutcome fp32 = run("off"), bf16 = run("bf16");
  ASSERT_TRUE(fp32.result.eval && bf16.result.eval);
  const double a32 = *fp32.result.eval->accuracy, a16 = *bf16.result.eval->accuracy;
  EXPECT_GT(a32, 0.70) << "120 steps of 64 on the test split's first 2560 images";
  EXPECT_NEAR(a16, a32, 0.02) << "the accuracy band of fp32";
  // The evaluation's loss (2560 images), not the last batch's: one batch of 64 moved 8% between
  // fp32 runs that differ only in summation order (NCHW against channels-last).
  EXPECT_NEAR(bf16.result.eval->loss, fp32.result.eval->loss, 0.05 * fp32.result.eval->loss);
  for (const auto& p : bf16.model->parameters()) EXPECT_EQ(p.scalar_type(), at::kFloat) << "fp32 master weights";
}

}  // namespace
}  // namespace ht::test

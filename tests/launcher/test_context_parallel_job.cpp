// `parallel.context_parallel` under mpirun (issue 68: keys and values passed round a ring, or
// gathered). The oracle
// is the one-rank run of the same global batch: each rank of a context group trains its head and
// tail chunks of every sequence, and the group trains the one-rank run's model within fp32
// reduction order (Llama with grouped-query attention at c = 2 and 4; GPT-2's learned positions;
// with replicas and ZeRO, with tensor and sequence parallelism, with pipeline stages; on token
// files; in bf16 within its rounding). A DTR budget and full
// recomputation on each rank change no bit of the same layout; a checkpoint resumes at another c.
// Bad layouts are refused naming the keys, with exit status 2.
#include "tests/support/mpi_job.h"
#include "tests/support/run_records.h"
#include "tests/support/temp_dir.h"

#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

namespace ht::test::context_parallel_job {

using ::testing::HasSubstr;

// 8 heads over 4 key/value heads; 16 tokens: 2 and 4 ranks hold chunks of 4 and 2.
const char* kContextLlama = R"([model]
name = "llama"
n_layer = 2
n_head = 8
n_kv_heads = 4
n_embd = 32
block_size = 16
multiple_of = 16
[data]
dataset = "text"
path = "/usr/share/common-licenses/GPL-3"
[training]
steps = 4
global_batch_size = 8
micro_batch_size = 4
optimizer = "adamw"
lr = 0.003
grad_clip = 1.0
eval_batches = 2
threads = 1
[checkpoint]
interval = 2
[metrics]
log_interval = 1
)";

// AdamW divides each gradient by its own running scale, so fp32 reduction order moves a parameter
// whose gradient is near zero by up to a step (as test_tensor_parallel_job.cpp measured).
constexpr double kAdamTolerance = 2e-5;

std::vector<double> losses(const std::string& run) { return train_numbers(run + "/metrics.jsonl", "loss"); }

// The last evaluation's `key` ("eval_loss", "eval_samples") in a run's metrics.jsonl.
double eval_number(const std::string& run, const std::string& key) {
  std::ifstream in(run + "/metrics.jsonl");
  double number = -1;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json record = nlohmann::json::parse(line);
    if (record.value("event", "") == "eval") number = record.at(key).get<double>();
  }
  return number;
}

void expect_close_losses(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5) << "step " << i + 1;
}

class ContextParallelJob : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_mpirun()) GTEST_SKIP() << "no mpirun on this machine";
    config_ = dir_.write("job.toml", kContextLlama);
  }
  // Runs `ranks` ranks (1: no mpirun) with `options`; returns the output folder.
  std::string train(int ranks, const std::string& name, const std::string& options) {
    const std::string out = dir_.path(name), log = dir_.path(name + ".log");
    const std::string prefix = ranks > 1 ? mpirun(ranks) : "";
    EXPECT_EQ(run_logged(prefix + HT_BINARY + " " + config_ + " " + options + " --job.output_dir=" + out, log), 0)
        << read_file(log);
    return out;
  }
  TempDir dir_;
  std::string config_;
};

TEST_F(ContextParallelJob, ChunksOfEverySequenceTrainTheOneRankRunsModel) {
  const std::string one = train(1, "one", "");
  const int64_t kv = 8 * 4 * 16 * 4;  // B x Hkv x T x hd: the key/value heads, never the 8 query heads
  for (const auto& [c, exchange] : {std::pair{2, "ring"}, std::pair{4, "ring"}, std::pair{4, "all_gather"}}) {
    SCOPED_TRACE(std::to_string(c) + " " + exchange);
    const std::string run = train(c, "c" + std::to_string(c) + exchange,
                                  "--parallel.context_parallel=" + std::to_string(c) + " --parallel.context_exchange=" + exchange);
    expect_close_losses(losses(run), losses(one));
    EXPECT_NEAR(eval_number(run, "eval_loss"), eval_number(one, "eval_loss"), 1e-5);
    EXPECT_EQ(eval_number(run, "eval_samples"), eval_number(one, "eval_samples"));
    expect_same_model(one + "/checkpoints/step_00000004", run + "/checkpoints/step_00000004", kAdamTolerance);
    // A layer and step, in fp32. The ring passes each chunk of keys and values (2 kv / c) on
    // c - 1 times forward and again backward, and their gradients' sums c times: 3c - 2 chunks.
    // Gathered: forward and backward gather keys and values, and their gradients are
    // reduce-scattered, 6 exchanges of the whole sequence's, whatever c is.
    const int64_t elements = std::string(exchange) == "ring" ? (3 * c - 2) * 2 * kv / c : 6 * kv;
    EXPECT_EQ(last_train_number(run + "/metrics.jsonl", "context_bytes"), 2 * elements * 4);
  }
  EXPECT_THAT(read_file(dir_.path("c4ring.log")), HasSubstr("ranks: 4 (data-parallel 1 x context-parallel 4 x pipeline 1)"));
}

// GPT-2's learned positions follow the chunks; replicas (with ZeRO-2) and tensor-parallel groups
// with sequence parallelism compose with the context groups.
TEST_F(ContextParallelJob, WithLearnedPositionsReplicasZeroAndTensorParallelismItIsTheOneRankRun) {
  const std::string gpt = "--model.name=gpt --model.n_head=4 --model.n_kv_heads=0 --model.dropout=0 ";
  expect_close_losses(losses(train(2, "gpt_c2", gpt + "--parallel.context_parallel=2")), losses(train(1, "gpt", gpt)));
  const std::string one = train(1, "one", "");
  for (const std::string& layout : {std::string("--parallel.context_parallel=2 --parallel.shard=gradients"),
                                    std::string("--parallel.context_parallel=2 --parallel.tensor_parallel=2 "
                                                "--parallel.sequence_parallel=true")}) {
    SCOPED_TRACE(layout);
    const std::string run = train(4, "grid" + std::to_string(layout.size()), layout);
    expect_close_losses(losses(run), losses(one));
    expect_same_model(one + "/checkpoints/step_00000004", run + "/checkpoints/step_00000004", kAdamTolerance);
  }
}

// Pipeline stages pass each context rank's chunks to the next stage's rank of the same context
// rank (T / c tokens a message): 2 stages x 2 context ranks train the one-rank run's model, as
// 1F1B with the ring and as interleaved 1F1B with the gathers and ZeRO-1 over the context ranks.
// 1F1B's stages' peak is predicted within 3% (each stage's probe is of its chunks); interleaved
// 1F1B's is over-predicted here with or without context groups (17% at c = 1, 6% at c = 2).
TEST_F(ContextParallelJob, PipelineStagesCarryEachContextRanksChunks) {
  const std::string one = train(1, "one", "");
  for (const std::string& layout :
       {std::string("--parallel.context_parallel=2 --parallel.pipeline_parallel=2"),
        std::string("--parallel.context_parallel=2 --parallel.pipeline_parallel=2 --parallel.context_exchange=all_gather "
                    "--parallel.pipeline_schedule=interleaved_1f1b --parallel.virtual_stages=2 --parallel.shard=optimizer")}) {
    SCOPED_TRACE(layout);
    const std::string name = "staged" + std::to_string(layout.size());
    const std::string run = train(4, name, layout);
    EXPECT_THAT(read_file(dir_.path(name + ".log")), HasSubstr("ranks: 4 (data-parallel 1 x context-parallel 2 x pipeline 2)"));
    expect_close_losses(losses(run), losses(one));
    EXPECT_NEAR(eval_number(run, "eval_loss"), eval_number(one, "eval_loss"), 1e-5);
    EXPECT_EQ(eval_number(run, "eval_samples"), eval_number(one, "eval_samples"));
    expect_same_model(one + "/checkpoints/step_00000004", run + "/checkpoints/step_00000004", kAdamTolerance);
    if (layout.find("interleaved") != std::string::npos) continue;
    const double predicted = last_train_number(run + "/metrics.jsonl", "predicted_peak_bytes");
    const double measured = last_train_number(run + "/metrics.jsonl", "mem_peak_bytes");
    EXPECT_NEAR(predicted, measured, 0.03 * measured);
  }
}

// Under a budget with DTR, and with full recomputation, the same layout trains the same bits with
// a lower peak (the ring's kernel, run again where it found no room, goes on where it stopped).
// The attention's exchanges are never repeated (its output is kept: the ranks' causal
// blocks differ, so their evictions do).
TEST_F(ContextParallelJob, MemoryPoliciesOnEveryRankChangeNoBit) {
  const std::string bigger = "--model.n_layer=8 --model.block_size=64 --training.global_batch_size=32 "
                             "--training.micro_batch_size=8 --training.steps=3 --checkpoint.interval=3 "
                             "--parallel.context_parallel=2 ";
  const std::string plain = train(2, "plain", bigger);
  for (const std::string& policy : {std::string("--memory.budget=4.5MB --memory.policy=dtr"),
                                    std::string("--memory.budget=1GiB --memory.policy=full")}) {
    SCOPED_TRACE(policy);
    const std::string run = train(2, "policy" + std::to_string(policy.size()), bigger + policy);
    EXPECT_GT(last_train_number(run + "/metrics.jsonl", "recomputations"), 0);
    // No exchange repeated: the same bytes as without the policy.
    EXPECT_EQ(last_train_number(run + "/metrics.jsonl", "context_bytes"),
              last_train_number(plain + "/metrics.jsonl", "context_bytes"));
    EXPECT_LT(last_train_number(run + "/metrics.jsonl", "mem_peak_bytes"),
              last_train_number(plain + "/metrics.jsonl", "mem_peak_bytes") * 0.8);
    EXPECT_EQ(losses(run), losses(plain));
    expect_same_model(plain + "/checkpoints/step_00000003", run + "/checkpoints/step_00000003");
  }
}

// Saved at c = 2 after step 2, resumed on one rank and at c = 4: both end where the uninterrupted
// run does (every rank of a group holds the whole weights; the checkpoint is the one-rank run's).
TEST_F(ContextParallelJob, ACheckpointResumesAtAnotherContextCount) {
  const std::string whole = train(2, "whole", "--parallel.context_parallel=2");
  const std::vector<double> all = losses(whole), after_step_2(all.begin() + 2, all.end());
  for (int c : {1, 4}) {
    SCOPED_TRACE(c);
    const std::string name = "resumed" + std::to_string(c);
    std::filesystem::create_directories(dir_.path(name + "/checkpoints"));
    std::filesystem::copy(whole + "/checkpoints/step_00000002", dir_.path(name + "/checkpoints/step_00000002"),
                          std::filesystem::copy_options::recursive);
    const std::string resumed = train(c, name, "--parallel.context_parallel=" + std::to_string(c) + " --checkpoint.resume=latest");
    expect_close_losses(losses(resumed), after_step_2);
    expect_same_model(whole + "/checkpoints/step_00000004", resumed + "/checkpoints/step_00000004", kAdamTolerance);
  }
}

// bf16 autocast: the gathered keys and values in 16 bits, their gradients' sums reduce-scattered in
// fp32; the one-rank run's losses within bf16's rounding (measured: at most 2e-4 apart).
TEST_F(ContextParallelJob, Bf16TrainsTheOneRankRunWithinItsRounding) {
  const std::string bf16 = "--training.mixed_precision=bf16 ";
  const std::vector<double> one = losses(train(1, "bf16_one", bf16)),
                            split = losses(train(2, "bf16_c2", bf16 + "--parallel.context_parallel=2"));
  ASSERT_EQ(split.size(), one.size());
  for (size_t i = 0; i < one.size(); ++i) EXPECT_NEAR(split[i], one[i], 1e-3) << "step " << i + 1;
}

// Token files (llm.c's format): each window is cut across the group, never across the files.
TEST_F(ContextParallelJob, TokenFilesWindowsAreCutAcrossTheGroup) {
  ASSERT_EQ(run(std::string(HT_BINARY) + " tokenize --input /usr/share/common-licenses/GPL-3 --model-prefix " +
                dir_.path("tok") + " --output " + dir_.path("gpl.bin") + " --vocab-size 400 --eval-fraction 0.1"),
            0);
  const std::string tokens = "--data.dataset=tokens --data.path=" + dir_.path("gpl.bin") +
                             " --data.eval_path=" + dir_.path("gpl_val.bin") + " --model.vocab_size=0 ";
  const std::string one = train(1, "tokens1", tokens), split = train(2, "tokens2", tokens + "--parallel.context_parallel=2");
  expect_close_losses(losses(split), losses(one));
  EXPECT_NEAR(eval_number(split, "eval_loss"), eval_number(one, "eval_loss"), 1e-5);
}

// The planner prices a context rank from a profile of rank 0's chunks with its group mirrored: its
// peak is the run's within 3% (the exchanges' buffers and the kernel's chunks are measured, not
// modelled); parallel.strategy = "auto" chooses the rest of a plan at the configured c, and
// `hybrid_train plan` plans at it.
TEST_F(ContextParallelJob, ThePlannerPricesTheContextRanksPart) {
  for (const std::string exchange : {"ring", "all_gather"}) {
    SCOPED_TRACE(exchange);
    const std::string run = train(2, "priced_" + exchange, "--parallel.context_parallel=2 --parallel.context_exchange=" + exchange);
    EXPECT_THAT(read_file(dir_.path("priced_" + exchange + ".log")),
                HasSubstr("in the context-parallel group's exchanges (2 ranks, sequences split 2 ways (" + exchange + ")"));
    const double predicted = last_train_number(run + "/metrics.jsonl", "predicted_peak_bytes");
    const double measured = last_train_number(run + "/metrics.jsonl", "mem_peak_bytes");
    EXPECT_NEAR(predicted, measured, 0.03 * measured);
  }
  train(2, "auto", "--parallel.context_parallel=2 --parallel.strategy=auto");
  EXPECT_THAT(read_file(dir_.path("auto.log")), HasSubstr("sequences split 2 ways (ring)"));
  // Planned here (a measured profile), and for a GPU cluster (a step traced on meta tensors): every
  // plan at c = 2, with its exchange.
  for (const std::string where : {"", " --cluster h100-sxm:1x2"}) {
    SCOPED_TRACE(where);
    const std::string out = dir_.path("plan" + std::to_string(where.size())), log = out + ".log";
    EXPECT_EQ(run_logged(std::string(HT_BINARY) + " plan " + config_ + " --parallel.context_parallel=2 --ranks 2" + where +
                             " --job.output_dir=" + out, log), 0) << read_file(log);
    std::ifstream plans(out + "/plans.jsonl");
    int count = 0;
    for (std::string line; std::getline(plans, line); ++count) {
      const nlohmann::json plan = nlohmann::json::parse(line);
      EXPECT_EQ(plan.at("context_parallel").get<int>(), 2) << line;
      EXPECT_EQ(plan.at("context_exchange").get<std::string>(), "ring") << line;
    }
    EXPECT_GT(count, 0);
  }
  // c and the exchange in the search: each (t, c, exchange) asked is a profile of its own, and
  // stages carry context groups.
  const std::string out = dir_.path("plan_c"), log = out + ".log";
  ASSERT_EQ(run_logged(std::string(HT_BINARY) + " plan " + config_ + " --tensor 1,2 --context 1,2 --ranks 4 --stages 1,2 " +
                           "--context-exchange ring,all_gather --job.output_dir=" + out, log), 0) << read_file(log);
  std::set<std::pair<int, int>> context_stages;
  std::set<std::pair<int, std::string>> tensor_exchanges;  // at c = 2
  std::ifstream plans(out + "/plans.jsonl");
  for (std::string line; std::getline(plans, line);) {
    const nlohmann::json plan = nlohmann::json::parse(line);
    const int c = plan.at("context_parallel").get<int>(), t = plan.at("tensor_parallel").get<int>();
    if (t == 1) context_stages.insert({c, plan.at("pipeline_parallel").get<int>()});
    if (c == 2) tensor_exchanges.insert({t, plan.at("context_exchange").get<std::string>()});
  }
  for (const std::pair<int, int>& layout : {std::pair{1, 1}, std::pair{2, 1}, std::pair{1, 2}, std::pair{2, 2}})
    EXPECT_EQ(context_stages.count(layout), 1u) << layout.first << " context ranks, " << layout.second << " stages";
  for (const std::pair<int, std::string>& split : {std::pair<int, std::string>{1, "ring"}, {1, "all_gather"}, {2, "ring"},
                                                   {2, "all_gather"}})
    EXPECT_EQ(tensor_exchanges.count(split), 1u) << "t = " << split.first << " beside c = 2 exchanging by " << split.second;
  // The plan written trains the exchange planned, not the config's (ring, the default).
  const std::string gathered = dir_.path("plan_gathered");
  ASSERT_EQ(run_logged(std::string(HT_BINARY) + " plan " + config_ + " --context 2 --context-exchange all_gather --ranks 2 "
                           "--job.output_dir=" + gathered, gathered + ".log"), 0) << read_file(gathered + ".log");
  EXPECT_THAT(read_file(gathered + "/plan.toml"), HasSubstr("context_exchange = \"all_gather\""));
}

// Each refused with status 2, naming the key and what would work, before anything is written.
TEST_F(ContextParallelJob, LayoutsThatCannotSplitTheSequenceAreRefusedNamingTheKeys) {
  const std::vector<std::pair<std::string, std::string>> cases{
      {"--parallel.context_parallel=3", "model.block_size = 16 is not a multiple of 2 x parallel.context_parallel = 3"},
      {"--parallel.context_parallel=2", "start it with mpirun -np 2"},
      {"--parallel.context_parallel=2 --model.name=mlp --data.dataset=synthetic",
       "only the transformers (gpt, llama) train on sequences to split"},
      {"--parallel.context_parallel=2 --parallel.shard=parameters --memory.budget=8MB --memory.policy=dtr",
       "use parallel.shard = \"gradients\""},
  };
  // A planned size the sequence cannot split.
  const std::string log = dir_.path("plan_refused.log");
  EXPECT_EQ(WEXITSTATUS(run_logged(std::string(HT_BINARY) + " plan " + config_ + " --context 3 --job.output_dir=" +
                                       dir_.path("plan_refused"), log)), 2);
  EXPECT_THAT(read_file(log), HasSubstr("no context-parallel size asked splits the sequence: --context 3: "));
  EXPECT_FALSE(std::filesystem::exists(dir_.path("plan_refused")));
  EXPECT_EQ(WEXITSTATUS(run_logged(std::string(HT_BINARY) + " plan " + config_ + " --context 2 --context-exchange ring,gather "
                                       "--job.output_dir=" + dir_.path("plan_refused"), log)), 2);
  EXPECT_THAT(read_file(log), HasSubstr("--context-exchange ring,gather: 'gather' is not a way to exchange keys and values; "
                                        "use ring or all_gather"));
  EXPECT_FALSE(std::filesystem::exists(dir_.path("plan_refused")));
  for (const auto& [options, message] : cases) {
    SCOPED_TRACE(options);
    const std::string out = dir_.path("refused"), log = dir_.path("refused.log");
    EXPECT_EQ(WEXITSTATUS(run_logged(std::string(HT_BINARY) + " " + config_ + " " + options + " --job.output_dir=" + out, log)), 2);
    EXPECT_THAT(read_file(log), HasSubstr(message));
    EXPECT_FALSE(std::filesystem::exists(out)) << "written before refusing";
  }
}

}  // namespace ht::test::context_parallel_job

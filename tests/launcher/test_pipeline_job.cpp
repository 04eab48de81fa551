// `mpirun -np (dp x pp) hybrid_train --parallel.pipeline_parallel=pp`: the oracle is one rank with
// the same global batch and micro-batches. Stages run the same kernels on the same values, so a
// pipeline without tied weights ends with the single rank's parameters bit for bit, whatever its
// schedule; a tied weight's two gradients are summed in another order (within fp32 rounding),
// except with one micro-batch, where the sum of two is the same either way.
#include "launcher/config/config_text.h"
#include "tests/support/mpi_job.h"
#include "tests/support/run_records.h"
#include "tests/support/temp_dir.h"

#include <torch/serialize/input-archive.h>

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <regex>
#include <thread>

namespace ht::test {
namespace {

using ::testing::HasSubstr;

// 8 blocks (7 hidden layers and the head), dropout on: the seeds each stage draws must be the
// ones one rank draws.
const char* kPipelineMlp = R"([model]
name = "mlp"
hidden = [24, 24, 24, 24, 24, 24, 24]
dropout = 0.1
[data]
dataset = "synthetic"
synthetic_samples = 256
synthetic_eval_samples = 64
synthetic_shape = [3, 4, 4]
synthetic_classes = 4
[training]
steps = 4
global_batch_size = 32
micro_batch_size = 8
lr = 0.1
warmup_steps = 2
grad_clip = 1.0
threads = 1
[checkpoint]
interval = 4
)";

const char* kGpt = R"([model]
name = "gpt"
n_layer = 2
n_head = 2
n_embd = 32
block_size = 16
dropout = 0.1
[data]
dataset = "text"
path = "/usr/share/common-licenses/GPL-3"
[training]
steps = 3
global_batch_size = 8
optimizer = "adamw"
lr = 0.003
grad_clip = 1.0
eval_batches = 2
threads = 1
[checkpoint]
interval = 3
)";

struct Case {
  const char* schedule;
  int stages;
  int virtual_stages;
  const char* p2p = "auto";  // nccl_like: the messages as NCCL carries them (parallel/nccl_like_communicator.h)
};

class PipelineJob : public ::testing::TestWithParam<Case> {};

TEST_P(PipelineJob, StagesTrainTheSingleRankModelBitForBit) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun on this machine";
  const Case c = GetParam();
  TempDir dir;
  const std::string config = dir.write("job.toml", kPipelineMlp);
  ASSERT_EQ(run(std::string(HT_BINARY) + " " + config + " --job.output_dir=" + dir.path("one")), 0);
  const std::string log = dir.path("log.txt");
  ASSERT_EQ(run_logged(mpirun(c.stages) + HT_BINARY + " " + config + " --parallel.pipeline_parallel=" +
                           std::to_string(c.stages) + " --parallel.pipeline_schedule=" + c.schedule +
                           " --parallel.virtual_stages=" + std::to_string(c.virtual_stages) +
                           " --parallel.pipeline_p2p=" + c.p2p + " --job.output_dir=" + dir.path("piped"), log),
            0) << read_file(log);
  expect_same_model(dir.path("one/checkpoints/step_00000004/model.pt"),
                    dir.path("piped/checkpoints/step_00000004/model.pt"));
  EXPECT_THAT(read_file(log), HasSubstr("pipeline: " + std::string(c.schedule)));
  EXPECT_THAT(read_file(log), HasSubstr(c.p2p == std::string("auto") ? "pipeline messages over mpi: matched by tag"
                                                                      : "over mpi, nccl_like: matched in posting order"));
  const std::string metrics = read_file(dir.path("piped/metrics.jsonl"));
  EXPECT_THAT(metrics, HasSubstr("\"stage_wait_ms\": ["));
  EXPECT_THAT(metrics, HasSubstr("\"stage_p2p_bytes\": ["));
  // The evaluation crosses the stages too: the same loss as one rank's.
  const std::regex eval("\"eval_loss\": ([0-9.e-]+)");
  std::smatch one_eval, piped_eval;
  const std::string one_metrics = read_file(dir.path("one/metrics.jsonl"));
  ASSERT_TRUE(std::regex_search(one_metrics, one_eval, eval));
  ASSERT_TRUE(std::regex_search(metrics, piped_eval, eval));
  EXPECT_EQ(one_eval[1], piped_eval[1]);
}

INSTANTIATE_TEST_SUITE_P(Schedules, PipelineJob,
                         ::testing::Values(Case{"gpipe", 2, 1}, Case{"1f1b", 2, 1}, Case{"interleaved_1f1b", 2, 2},
                                           Case{"zb_h1", 2, 1}, Case{"gpipe", 4, 1}, Case{"1f1b", 4, 1},
                                           Case{"interleaved_1f1b", 4, 2}, Case{"zb_h1", 4, 1},
                                           // NCCL's way: every schedule, and the interleaved one over
                                           // two rounds of micro-batches (forward and backward paired).
                                           Case{"gpipe", 2, 1, "nccl_like"}, Case{"1f1b", 4, 1, "nccl_like"},
                                           Case{"interleaved_1f1b", 2, 2, "nccl_like"},
                                           Case{"zb_h1", 4, 1, "nccl_like"}),
                         [](const auto& info) {
                           return std::string(info.param.schedule == std::string("interleaved_1f1b") ? "interleaved"
                                                                                                     : info.param.schedule) +
                                  "_pp" + std::to_string(info.param.stages) +
                                  (info.param.p2p == std::string("auto") ? "" : "_nccl_like");
                         });

// GPT ties its embedding (first stage) to its output layer (last stage).
TEST(PipelineJobTied, GptWithTiedWeightsOnTwoStages) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun on this machine";
  TempDir dir;
  const std::string config = dir.write("job.toml", kGpt);
  const std::string piped = mpirun(2) + HT_BINARY + " " + config + " --parallel.pipeline_parallel=2 ";
  // One micro-batch: the two gradients' sum is the single rank's, bit for bit.
  ASSERT_EQ(run(std::string(HT_BINARY) + " " + config + " --job.output_dir=" + dir.path("one")), 0);
  ASSERT_EQ(run(piped + "--job.output_dir=" + dir.path("piped")), 0);
  expect_same_model(dir.path("one/checkpoints/step_00000003/model.pt"),
                    dir.path("piped/checkpoints/step_00000003/model.pt"));
  // Four: within fp32 rounding of the other order. The messages as NCCL carries them: the tied
  // gradients' exchange is one group (a lone send first would wait for ever there), and the
  // checkpoint's gathers cross in order.
  ASSERT_EQ(run(std::string(HT_BINARY) + " " + config + " --training.micro_batch_size=2 --job.output_dir=" +
                dir.path("one4")), 0);
  ASSERT_EQ(run(piped + "--training.micro_batch_size=2 --parallel.pipeline_p2p=nccl_like --job.output_dir=" +
                dir.path("piped4")), 0);
  expect_same_model(dir.path("one4/checkpoints/step_00000003/model.pt"),
                    dir.path("piped4/checkpoints/step_00000003/model.pt"), 1e-5);
}

// The Llama layout on two stages, its head untied (its own weight on the last stage) and tied
// (a copy there, kept in sync): one micro-batch, so the piped run is the single rank's bit for bit.
TEST(PipelineJobTied, LlamaTiedAndUntiedOnTwoStages) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun on this machine";
  TempDir dir;
  const std::string config = dir.write("job.toml", kGpt);
  for (const std::string tied : {"false", "true"}) {
    SCOPED_TRACE("tie_embeddings = " + tied);
    const std::string llama = " --model.name=llama --model.n_kv_heads=1 --model.multiple_of=16 --model.tie_embeddings=" + tied;
    ASSERT_EQ(run(std::string(HT_BINARY) + " " + config + llama + " --job.output_dir=" + dir.path("one" + tied)), 0);
    ASSERT_EQ(run(mpirun(2) + HT_BINARY + " " + config + llama + " --parallel.pipeline_parallel=2 --job.output_dir=" +
                  dir.path("piped" + tied)), 0);
    expect_same_model(dir.path("one" + tied + "/checkpoints/step_00000003/model.pt"),
                      dir.path("piped" + tied + "/checkpoints/step_00000003/model.pt"));
  }
}

// Two replicas of two stages: each stage's gradients are averaged over its replicas.
TEST(PipelineJobGrid, TwoReplicasOfTwoStages) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun on this machine";
  TempDir dir;
  const std::string config = dir.write("job.toml", kPipelineMlp);
  const std::string log = dir.path("log.txt");
  // Without dropout: each replica draws its own masks, by design, so only then is one rank the
  // oracle of two replicas (within fp32 reduction order); two replicas of one stage are the
  // oracle of two replicas of two stages, bit for bit.
  const std::string job = std::string(HT_BINARY) + " " + config + " --training.micro_batch_size=4 --model.dropout=0 ";
  ASSERT_EQ(run(job + "--job.output_dir=" + dir.path("one")), 0);
  ASSERT_EQ(run(mpirun(2) + job + "--job.output_dir=" + dir.path("dp")), 0);
  ASSERT_EQ(run_logged(mpirun(4) + job + "--parallel.pipeline_parallel=2 --job.output_dir=" + dir.path("grid"), log), 0)
      << read_file(log);
  EXPECT_THAT(read_file(log), HasSubstr("ranks: 4 (data-parallel 2 x pipeline 2)"));
  expect_same_model(dir.path("dp/checkpoints/step_00000004/model.pt"), dir.path("grid/checkpoints/step_00000004/model.pt"));
  expect_same_model(dir.path("one/checkpoints/step_00000004/model.pt"), dir.path("grid/checkpoints/step_00000004/model.pt"),
                    1e-5);
}

// A checkpoint holds the whole model in one layout: saved by 2 stages, it resumes on one rank
// (and the other way), and training goes on as if never stopped.
TEST(PipelineJobCheckpoint, ResumesWithAnotherStageCount) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun on this machine";
  TempDir dir;
  const std::string config = dir.write("job.toml", kPipelineMlp);
  const std::string one = std::string(HT_BINARY) + " " + config + " --checkpoint.interval=2 ";
  const std::string two = mpirun(2) + HT_BINARY + " " + config + " --checkpoint.interval=2 --parallel.pipeline_parallel=2 ";
  ASSERT_EQ(run(one + "--job.output_dir=" + dir.path("straight")), 0);
  ASSERT_EQ(run(two + "--training.steps=2 --job.output_dir=" + dir.path("a")), 0);
  ASSERT_EQ(run(one + "--checkpoint.resume=" + dir.path("a/checkpoints/step_00000002") + " --job.output_dir=" +
                dir.path("a1")), 0);
  // Two more steps of SGD with momentum from the gathered state: a momentum buffer that did not
  // reach rank 0 would change them. (optimizer.pt's bytes are not compared: libtorch writes the
  // state in its hash map's order, which depends on where the parameters were allocated.)
  expect_same_model(dir.path("straight/checkpoints/step_00000004/model.pt"),
                    dir.path("a1/checkpoints/step_00000004/model.pt"));
  ASSERT_EQ(run(two + "--checkpoint.resume=" + dir.path("straight/checkpoints/step_00000002") + " --job.output_dir=" +
                dir.path("b2")), 0);
  expect_same_model(dir.path("straight/checkpoints/step_00000004/model.pt"),
                    dir.path("b2/checkpoints/step_00000004/model.pt"));
}

int64_t largest_stage_peak(const std::string& metrics) {
  const std::regex peaks("\"stage_peak_bytes\": \\[([0-9., e+]+)\\]");
  int64_t largest = 0;
  for (std::sregex_iterator it(metrics.begin(), metrics.end(), peaks), end; it != end; ++it) {
    std::string list = (*it)[1];
    std::replace(list.begin(), list.end(), ',', ' ');
    std::istringstream values(list);
    for (double v; values >> v;) largest = std::max(largest, static_cast<int64_t>(v));
  }
  return largest;
}

// Each stage has its own memory manager: DTR under a budget on every stage changes no bit.
TEST(PipelineJobMemory, DtrUnderABudgetOnEachStage) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun on this machine";
  TempDir dir;
  const std::string config = dir.write("job.toml", std::string(kGpt) + "[metrics]\nlog_interval = 1\n");
  // Modelled stage costs: the same cut in every run (measured times move it on a busy machine,
  // and the stages' memory with it).
  const std::string job = mpirun(2) + HT_BINARY + " " + config +
                          " --model.n_layer=6 --training.micro_batch_size=4 --parallel.pipeline_parallel=2 "
                          "--parallel.stage_costs=modeled ";
  ASSERT_EQ(run(job + "--memory.budget=1GiB --job.output_dir=" + dir.path("roomy")), 0);
  const int64_t peak = largest_stage_peak(read_file(dir.path("roomy/metrics.jsonl")));
  ASSERT_GT(peak, 0);
  // A stage keeps only its own parameters, gradients, optimizer state and activations: each
  // peaks below one rank holding the whole model (the last stage, without the first's in-flight
  // micro-batches, near half). Memory, not time: the same on any machine.
  const std::string one = std::string(HT_BINARY) + " " + config + " --model.n_layer=6 --training.micro_batch_size=4 ";
  ASSERT_EQ(run(one + "--memory.budget=1GiB --job.output_dir=" + dir.path("one")), 0);
  const std::string one_summary = read_file(dir.path("one/summary.json"));
  const int64_t one_peak = std::stoll(one_summary.substr(one_summary.find("\"mem_peak_bytes\": ") + 18));
  const std::string stages = read_file(dir.path("roomy/metrics.jsonl"));
  const std::regex last_stage("\"stage_peak_bytes\": \\[[0-9.e+]+, ([0-9.e+]+)\\]");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(stages, m, last_stage)) << stages;
  EXPECT_LT(peak, one_peak);
  EXPECT_LT(std::stod(m[1]), 0.6 * static_cast<double>(one_peak));
  const std::string log = dir.path("log.txt");
  ASSERT_EQ(run_logged(job + "--memory.policy=dtr --memory.budget=" + std::to_string(peak * 7 / 10) +
                           " --job.output_dir=" + dir.path("dtr"), log), 0) << read_file(log);
  // The roomy run evicted nothing: it is the job without the budget's effect.
  expect_same_model(dir.path("roomy/checkpoints/step_00000003/model.pt"),
                    dir.path("dtr/checkpoints/step_00000003/model.pt"));
  EXPECT_THAT(read_file(dir.path("dtr/metrics.jsonl")), ::testing::Not(HasSubstr("\"evictions\": 0,")))
      << "the budget made DTR evict on stage 0";
}

// A channels-last ConvNet on two stages: activations and their gradients cross in the layout the
// stages' kernels use (a NCHW copy had the next convolution copy its input back and the pooling
// backward copy its indices), and the stages train the one-rank model bit for bit (one thread a
// rank: oneDNN's reductions follow the threads).
TEST(PipelineJobMemory, ChannelsLastStagesTrainTheOneRankModel) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun on this machine";
  TempDir dir;
  const std::string config = dir.write("job.toml", kTinyConvNet) +
                             " --training.steps=3 --training.micro_batch_size=16 --training.threads=1 --checkpoint.interval=3";
  ASSERT_EQ(run(std::string(HT_BINARY) + " " + config + " --job.output_dir=" + dir.path("one")), 0);
  const std::string log = dir.path("log.txt");
  ASSERT_EQ(run_logged(mpirun(2) + HT_BINARY + " " + config + " --parallel.pipeline_parallel=2 --parallel.stage_blocks=[1,2]" +
                           " --job.output_dir=" + dir.path("piped"), log),
            0) << read_file(log);
  expect_same_model(dir.path("one/checkpoints/step_00000003/model.pt"),
                    dir.path("piped/checkpoints/step_00000003/model.pt"));
  // And the first stage peaks as predicted: in block 0's batch-norm backward, its output kept for
  // the micro-batch's backward (one rank frees it in block 1's), beside the gradient received and
  // the next one posted. Measured here: +0.07% (it was -3.1% without the kept output).
  const std::string metrics = read_file(dir.path("piped/metrics.jsonl"));
  const double predicted = last_train_number(dir.path("piped/metrics.jsonl"), "predicted_peak_bytes");
  const double measured = static_cast<double>(largest_stage_peak(metrics));
  EXPECT_NEAR(predicted / measured, 1.0, 0.005) << "predicted " << predicted << ", fullest stage " << measured;
}

// `plan` writes the cut it predicted (parallel.stage_blocks), and a run peaks where it predicts:
// each block's tensors kept for backward per micro-batch in flight, the stage's peak above them
// once, what crosses the cuts, from the one-rank trace. The plan's pick (cut and micro-batch)
// follows the machine's timing, so the run is pinned to one: memory is the same on any machine.
TEST(PipelineJobMemory, APlansStagesPeakAsPredicted) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun on this machine";
  TempDir dir;
  const std::string config = dir.write("job.toml", std::string(kTinyGpt));
  const std::string log = dir.path("log.txt");
  ASSERT_EQ(run_logged(std::string(HT_BINARY) + " plan " + config + " --model.n_layer=4 --ranks 2 --stages 2" +
                           " --precisions off --job.output_dir=" + dir.path("plan"), log),
            0) << read_file(log);
  const std::string plan = read_file(dir.path("plan/plan.toml"));
  std::smatch cut;
  ASSERT_TRUE(std::regex_search(plan, cut, std::regex("\\nstage_blocks = \\[([0-9]+), ([0-9]+)\\]"))) << plan;
  EXPECT_EQ(std::stoi(cut[1]) + std::stoi(cut[2]), 6) << "the embedding, four layers and the head";
  ASSERT_EQ(run_logged(mpirun(2) + HT_BINARY + " " + dir.path("plan/plan.toml") +
                           " --parallel.stage_blocks=[3,3] --training.micro_batch_size=1 --job.output_dir=" +
                           dir.path("run"),
                       log),
            0) << read_file(log);
  const std::string metrics = dir.path("run/metrics.jsonl");
  const double predicted = last_train_number(metrics, "predicted_peak_bytes");
  const double measured = static_cast<double>(largest_stage_peak(read_file(metrics)));
  // Measured here: to the byte (before stages kept their output through backward: -0.33%).
  EXPECT_NEAR(predicted / measured, 1.0, 0.01) << "predicted " << predicted << ", fullest stage " << measured;
}

// Kept 16-bit weight copies: a stage holds each copy once, not a cast per micro-batch in flight
// (stage 0 has two of its 16 in flight). The plan's budget never evicts: it keeps them.
TEST(PipelineJobMemory, KeptWeightCopiesPeakAsPredicted) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun on this machine";
  TempDir dir;
  const std::string config = dir.write("job.toml", std::string(kTinyGpt));
  const std::string log = dir.path("log.txt");
  ASSERT_EQ(run_logged(std::string(HT_BINARY) + " plan " + config + " --model.n_layer=4 --ranks 2 --stages 2" +
                           " --precisions bf16 --job.output_dir=" + dir.path("plan"), log),
            0) << read_file(log);
  EXPECT_THAT(read_file(dir.path("plan/plan.toml")), HasSubstr("\ncompute_weights = \"kept\""));
  for (const char* weights : {"kept", "cast"}) {
    const std::string out = dir.path(weights);
    ASSERT_EQ(run_logged(mpirun(2) + HT_BINARY + " " + dir.path("plan/plan.toml") +
                             " --parallel.stage_blocks=[3,3] --training.micro_batch_size=1 --training.compute_weights=" +
                             weights + " --job.output_dir=" + out, log),
              0) << read_file(log);
    const double predicted = last_train_number(out + "/metrics.jsonl", "predicted_peak_bytes");
    const double measured = static_cast<double>(largest_stage_peak(read_file(out + "/metrics.jsonl")));
    // Measured: cast to the byte (7.5% more than kept: the second micro-batch's casts); kept +0.70%
    // on a CPU with AVX-512 and +1.9% on one without (2026-12-03, an AMD EPYC with AVX2 only: its
    // bf16 products' temporaries differ), an upper bound: a stage's kept copies are priced by taking
    // the casts alive at its traced peak away (planner/pipeline_terms.cpp), not by the walk without
    // the casts that one rank's step gets (planner/weight_copy_terms.h, walks_without_casts).
    const bool kept = std::string(weights) == "kept";
    EXPECT_GE(predicted / measured, kept ? 1.0 : 0.99) << weights << ": predicted " << predicted << ", fullest stage " << measured;
    EXPECT_LE(predicted / measured, kept ? 1.025 : 1.01) << weights << ": predicted " << predicted << ", fullest stage " << measured;
  }
}

// The last record's peaks of a two-stage run.
std::pair<int64_t, int64_t> two_stage_peaks(const std::string& metrics) {
  const std::regex peaks("\"stage_peak_bytes\": \\[([0-9.e+]+), ([0-9.e+]+)\\]");
  std::pair<int64_t, int64_t> last{-1, -1};
  for (std::sregex_iterator it(metrics.begin(), metrics.end(), peaks), end; it != end; ++it)
    last = {static_cast<int64_t>(std::stod((*it)[1])), static_cast<int64_t>(std::stod((*it)[2]))};
  return last;
}

// A 4-layer GPT on two stages cut [3,3] in a roomy budget, logging every step: the command, to
// which a test adds its policy and output folder.
std::string two_stage_gpt(TempDir& dir) {
  const std::string config = dir.write("job.toml", std::string(kGpt) + "[metrics]\nlog_interval = 1\n");
  return mpirun(2) + HT_BINARY + " " + config +
         " --model.n_layer=4 --model.n_embd=64 --training.micro_batch_size=2 --parallel.pipeline_parallel=2"
         " --parallel.stage_blocks=[3,3] --memory.budget=1GiB ";
}

// memory.block_keep per stage (AdaPipe's plan): each stage runs its own share, so the first stage
// at 0% peaks as under full recomputation and the last at 100% as without any; the model is the
// roomy run's bit for bit; the planner replays each stage's share and predicts the fullest stage.
TEST(PipelineJobMemory, ASharePerStage) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun on this machine";
  TempDir dir;
  const std::string job = two_stage_gpt(dir);
  const std::string log = dir.path("log.txt");
  for (const auto& [name, args] : std::vector<std::pair<std::string, std::string>>{
           {"roomy", "--memory.policy=none"},
           {"full", "--memory.policy=full"},
           {"staged", "--memory.policy=per_block --memory.block_keep=0%,100%"}}) {
    ASSERT_EQ(run_logged(job + args + " --job.output_dir=" + dir.path(name), log), 0) << read_file(log);
  }
  expect_same_model(dir.path("roomy/checkpoints/step_00000003/model.pt"),
                    dir.path("staged/checkpoints/step_00000003/model.pt"));
  const auto roomy = two_stage_peaks(read_file(dir.path("roomy/metrics.jsonl")));
  const auto full = two_stage_peaks(read_file(dir.path("full/metrics.jsonl")));
  const auto staged = two_stage_peaks(read_file(dir.path("staged/metrics.jsonl")));
  ASSERT_GT(roomy.first, 0);
  EXPECT_LT(full.first, roomy.first) << "full recomputation keeps less on stage 0";
  // A stage's sends hold their tensors until the transfer is seen done (parallel/pipeline_stage.cpp,
  // reap_sends), which is a matter of when the other rank calls into MPI: on a loaded machine the
  // same run peaks a message (2 x 16 x 64 floats) higher or lower, so two runs may differ by two.
  constexpr int64_t kMessage = 2 * 16 * 64 * 4;
  EXPECT_NEAR(staged.first, full.first, 2 * kMessage) << "stage 0 at 0%: full recomputation";
  EXPECT_NEAR(staged.second, roomy.second, 2 * kMessage) << "stage 1 at 100%: nothing recomputed";
  EXPECT_LT(staged.first + 2 * kMessage, roomy.first) << "stage 0 keeps less than with room";
  // Measured 2026-12-04: +1.77% (a stage's kept bytes are the whole model's replay at its share, scaled).
  const double predicted = last_train_number(dir.path("staged/metrics.jsonl"), "predicted_peak_bytes");
  const double measured = static_cast<double>(std::max(staged.first, staged.second));
  std::printf("stages at 0%%, 100%%: peaks %lld, %lld; predicted fullest %.0f (%+.2f%%)\n", static_cast<long long>(staged.first),
              static_cast<long long>(staged.second), predicted, 100 * (predicted / measured - 1));
  EXPECT_NEAR(predicted / measured, 1.0, 0.03) << "predicted " << predicted << ", fullest stage " << measured;
}

// memory.block_offload on two stages at 0% each: each stage offloads what its blocks' plans give
// the link, and the planner prices a stage's share of the whole model's replay (planner/
// recompute_terms.cpp): a stage's bytes are its share (1 / stages) of the whole model's, a mean per
// rank; stage 0's copies out a step (the metrics' rank) were that mean to the byte (2026-12-04,
// two layers a stage), held here within 5% (the blocks' plans weigh the link against measured
// kernel times). The model is the roomy run's bit for bit.
TEST(PipelineJobMemory, OffloadOnEachStageIsPredictedAndChangesNoBit) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun on this machine";
  TempDir dir;
  const std::string job = two_stage_gpt(dir);
  const std::string log = dir.path("log.txt");
  ASSERT_EQ(run_logged(job + "--memory.policy=none --job.output_dir=" + dir.path("roomy"), log), 0) << read_file(log);
  ASSERT_EQ(run_logged(job + "--memory.policy=per_block --memory.block_keep=0%,0% --memory.block_offload=true "
                             "--job.output_dir=" + dir.path("offload"), log),
            0) << read_file(log);
  expect_same_model(dir.path("roomy/checkpoints/step_00000003/model.pt"),
                    dir.path("offload/checkpoints/step_00000003/model.pt"));
  const double measured = last_train_number(dir.path("offload/metrics.jsonl"), "swap_out_bytes");
  EXPECT_GT(measured, 0);
  const std::string summary = read_file(dir.path("offload/summary.json"));
  std::smatch predicted;
  ASSERT_TRUE(std::regex_search(summary, predicted, std::regex("\"predicted_swap_out_bytes\": ([0-9.e+]+)"))) << summary;
  EXPECT_NEAR(std::stod(predicted[1]) / measured, 1.0, 0.05) << "predicted " << predicted[1] << ", measured " << measured;
  // Within 5% of the fullest stage's predicted peak the budget is tight: said before training,
  // which goes on (whether a step then finds no room depends on the copies' timing: not asserted).
  std::smatch peak;
  ASSERT_TRUE(std::regex_search(summary, peak, std::regex("\"predicted_peak_bytes\": ([0-9]+)"))) << summary;
  const int64_t tight = std::stoll(peak[1]) * 102 / 100;
  run_logged(job + "--memory.policy=per_block --memory.block_keep=0%,0% --memory.block_offload=true --training.steps=1 "
                   "--memory.budget=" + std::to_string(tight) + " --job.output_dir=" + dir.path("tight"), log);
  EXPECT_THAT(read_file(log), HasSubstr("is tight: the fullest pipeline stage's predicted peak")) << read_file(log);
}

TEST(PipelineJobErrors, RefusalsSayWhatWouldWork) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun on this machine";
  TempDir dir;
  const std::string config = dir.write("job.toml", kPipelineMlp);
  const std::string log = dir.path("log.txt");
  auto fails_with = [&](const std::string& command, const std::string& message) {
    EXPECT_EQ(run_logged(command, log) >> 8, 2) << command;
    EXPECT_THAT(read_file(log), HasSubstr(message)) << command;
  };
  const std::string bin = std::string(HT_BINARY) + " " + config + " --job.output_dir=" + dir.path("x");
  fails_with(mpirun(3) + bin + " --parallel.pipeline_parallel=2",
             "parallel.pipeline_parallel = 2 stages, but the job has 3 rank(s); start it with mpirun -np 2");
  fails_with(bin + " --parallel.pipeline_parallel=2", "but the job has 1 rank(s)");
  fails_with(mpirun(2) + bin + " --parallel.pipeline_parallel=2 --parallel.pipeline_schedule=interleaved_1f1b "
             "--parallel.virtual_stages=2 --model.hidden=[8,8]",
             "parallel.pipeline_parallel = 2 x parallel.virtual_stages = 2 makes 4 stages, but the model has 3 blocks; "
             "use at most 3 stages in all");
  fails_with(mpirun(2) + bin + " --parallel.pipeline_parallel=2 --parallel.stage_blocks=[3,3]",
             "parallel.stage_blocks");
  // What the micro-batches decide (schedules, memory policies) is refused before any rank starts
  // training, in tests/launcher/test_config_errors.cpp.
  EXPECT_FALSE(std::filesystem::exists(dir.path("x/metrics.jsonl"))) << "a refused run writes nothing";
}

}  // namespace
}  // namespace ht::test

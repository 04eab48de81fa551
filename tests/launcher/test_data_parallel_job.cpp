// `mpirun -np N hybrid_train`: N ranks with global batch B end with the parameters of one rank
// with global batch B, within fp32 reduction order; rank 0 alone writes the outputs.
#include "launcher/config/config_text.h"
#include "tests/support/mpi_job.h"
#include "tests/support/temp_dir.h"

#include <torch/serialize/input-archive.h>

#include <signal.h>
#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

namespace ht::test {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// No batch norm and no dropout: their statistics and masks are per rank by design (docs/parallelism.md).
const char* kMlp = R"([model]
name = "mlp"
hidden = [32, 32]
[data]
dataset = "synthetic"
synthetic_samples = 256
synthetic_eval_samples = 64
synthetic_shape = [3, 8, 8]
synthetic_classes = 4
[training]
steps = 6
global_batch_size = 32
lr = 0.1
warmup_steps = 2
threads = 1
[checkpoint]
interval = 6
)";


class DataParallelJob : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (run("mpirun --version") != 0) GTEST_SKIP() << "no mpirun on this machine";
  }
};

TEST_P(DataParallelJob, RanksTrainTheSingleRankModel) {
  const int ranks = GetParam();
  TempDir dir;
  const std::string config = dir.write("job.toml", kMlp);
  ASSERT_EQ(run(std::string(HT_BINARY) + " " + config + " --job.output_dir=" + dir.path("one")), 0);
  ASSERT_EQ(run(mpirun(ranks) + HT_BINARY + " " + config + " --job.output_dir=" + dir.path("many")), 0);
  expect_close_models(dir.path("one/checkpoints/step_00000006/model.pt"),
                      dir.path("many/checkpoints/step_00000006/model.pt"), 1e-4, 1e-6);
  const std::string metrics = read_file(dir.path("many/metrics.jsonl"));
  EXPECT_THAT(metrics, HasSubstr("\"comm_ms\""));
  EXPECT_THAT(metrics, HasSubstr("\"comm_bytes\""));
  EXPECT_THAT(metrics, HasSubstr("\"overlap\""));
  // Each logged step has every rank's step time, gathered to the one that writes the records.
  const size_t at = metrics.rfind("\"rank_step_ms\": [");
  ASSERT_NE(at, std::string::npos);
  const std::string times = metrics.substr(at, metrics.find(']', at) - at);
  EXPECT_EQ(std::count(times.begin(), times.end(), ','), ranks - 1) << times;
  EXPECT_EQ(times.find("[0,"), std::string::npos) << "rank 0's time is there: " << times;
  EXPECT_EQ(times.find(", 0,"), std::string::npos) << "and every other rank's: " << times;
  EXPECT_THAT(metrics, HasSubstr("\"rank_wait_ms\": ["));
  EXPECT_THAT(read_file(dir.path("many/config.resolved.toml")), HasSubstr("data_parallel = " + std::to_string(ranks)));
}

INSTANTIATE_TEST_SUITE_P(TwoAndFourRanks, DataParallelJob, ::testing::Values(2, 4));

TEST(DataParallelJobErrors, ABatchThatDoesNotDivideOrAWrongReplicaCount) {
  if (run("mpirun --version") != 0) GTEST_SKIP() << "no mpirun on this machine";
  TempDir dir;
  const std::string config = dir.write("job.toml", kMlp);
  const std::string log = dir.path("log.txt");
  // Refused before any rank trains: exit 2, one line from rank 0, not every rank's abort.
  const int status = std::system((mpirun(3) + HT_BINARY + " " + config + " --job.output_dir=" + dir.path("x") + " > " +
                                  log + " 2>&1").c_str());
  EXPECT_EQ(WEXITSTATUS(status), 2);
  const std::string refused = read_file(log);
  EXPECT_THAT(refused, HasSubstr("training.global_batch_size = 32 does not divide among 3 data-parallel ranks; "
                                 "use a multiple of 3 (e.g. 33)"));
  EXPECT_THAT(refused, Not(HasSubstr("rank 1:")));
  EXPECT_THAT(refused, Not(HasSubstr("MPI_ABORT")));
  EXPECT_NE(std::system((std::string(HT_BINARY) + " " + config + " --parallel.data_parallel=2 --job.output_dir=" +
                         dir.path("y") + " > " + log + " 2>&1").c_str()), 0);
  EXPECT_THAT(read_file(log), HasSubstr("parallel.data_parallel = 2 but the job has 1 data-parallel replica(s); start it "
                                        "with mpirun -np 2, or set parallel.data_parallel = 0 (all ranks)"));
}

// Composition: 2 ranks, each accumulating over 2 micro-batches and evicting with DTR at 40% of
// the peak the same job needs without a budget, end with byte-identical parameters (model.pt) to
// that job. Gradients are reduced in place, in buckets started during backward (the default),
// inside the budget. A Llama of 8 layers: its activations are most of its peak (a small ResNet's
// parameters, optimizer state and largest op leave no 40% budget workable).
TEST(DataParallelJobComposition, DtrAtFortyPercentAndAccumulationOnTwoRanks) {
  if (run("mpirun --version") != 0) GTEST_SKIP() << "no mpirun on this machine";
  TempDir dir;
  const std::string config = dir.write("job.toml", kEightLayerLlama);
  const std::string job = mpirun(2) + HT_BINARY + " " + config;
  ASSERT_EQ(run(job + " --memory.budget=1GiB --job.output_dir=" + dir.path("roomy")), 0);
  const std::string summary = read_file(dir.path("roomy/summary.json"));
  const size_t at = summary.find("\"mem_peak_bytes\": ");
  ASSERT_NE(at, std::string::npos) << summary;
  const int64_t peak = std::stoll(summary.substr(at + 18));
  ASSERT_EQ(run(job + " --job.output_dir=" + dir.path("plain")), 0);
  ASSERT_EQ(run(job + " --memory.policy=dtr --memory.budget=" + std::to_string(peak * 2 / 5) + " --job.output_dir=" +
                dir.path("dtr")),
            0);
  EXPECT_EQ(read_file(dir.path("plain/checkpoints/step_00000003/model.pt")),
            read_file(dir.path("dtr/checkpoints/step_00000003/model.pt")));
  EXPECT_THAT(read_file(dir.path("dtr/metrics.jsonl")), ::testing::Not(HasSubstr("\"evictions\": 0,")))
      << "the budget made DTR evict";
}

// Overlap starts buckets while the last micro-batch's backward runs; it must change no bit. A GPT
// ties its embedding to its output layer (one parameter, two uses: its gradient is final only
// after both), accumulates over 2 micro-batches (only the last may start buckets), and its
// 1 MiB buckets are several.
TEST(DataParallelJobOverlap, OverlapChangesNoBitOfTheModel) {
  if (run("mpirun --version") != 0) GTEST_SKIP() << "no mpirun on this machine";
  TempDir dir;
  const std::string config = dir.write("job.toml", R"([model]
name = "gpt"
n_layer = 2
n_head = 4
n_embd = 256
block_size = 16
[data]
dataset = "text"
path = "/usr/share/common-licenses/GPL-3"
[training]
steps = 3
global_batch_size = 8
micro_batch_size = 2
optimizer = "adamw"
eval_batches = 1
threads = 1
[parallel]
bucket_mb = 1
[checkpoint]
interval = 3
)");
  const std::string job = mpirun(2) + HT_BINARY + " " + config;
  ASSERT_EQ(run(job + " --parallel.overlap=true --job.output_dir=" + dir.path("during")), 0);
  ASSERT_EQ(run(job + " --parallel.overlap=false --job.output_dir=" + dir.path("after")), 0);
  const std::string during = read_file(dir.path("during/checkpoints/step_00000003/model.pt"));
  ASSERT_FALSE(during.empty());
  EXPECT_TRUE(during == read_file(dir.path("after/checkpoints/step_00000003/model.pt"))) << "model.pt differs";
  EXPECT_THAT(read_file(dir.path("during/metrics.jsonl")), HasSubstr("\"overlap\": "));
  EXPECT_THAT(read_file(dir.path("after/metrics.jsonl")), HasSubstr("\"overlap\": 0}"));
  // The listener fired: with overlap, buckets start while backward runs (the first bucket, the
  // last layers' gradients, is final long before the embedding's); without it, none does.
  EXPECT_THAT(read_file(dir.path("during/metrics.jsonl")),
              ::testing::ContainsRegex("\"buckets_started_in_backward\": [1-9]"));
  EXPECT_THAT(read_file(dir.path("after/metrics.jsonl")), HasSubstr("\"buckets_started_in_backward\": 0,"));
}

}  // namespace
}  // namespace ht::test

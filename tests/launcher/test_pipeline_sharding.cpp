// `parallel.shard = "optimizer"` with `parallel.pipeline_parallel`: ZeRO-1 within each stage's
// data-parallel group. The oracle is the same grid unsharded: the gradients are the same
// all-reduced ones, AdamW works element by element and the updated pieces are gathered back, so
// the parameters are the unsharded grid's bit for bit (at 2 replicas and at 3, whose shards are
// uneven), with GPT's tied embedding trained on the first stage and its copy on the last.
// Checkpoints are every rank's slices of its stage's tensors (a tied copy's left to the stage that
// registers it); they resume sharded or not, with or without stages.
#include "tests/support/mpi_job.h"
#include "tests/support/run_records.h"
#include "tests/support/temp_dir.h"

#include <filesystem>

namespace ht::test {
namespace {

using ::testing::HasSubstr;

// Dropout off: each replica draws its own masks, so only then are other grids an oracle too.
const char* kStagedGpt = R"([model]
name = "gpt"
n_layer = 2
n_head = 2
n_embd = 32
block_size = 16
dropout = 0.0
[data]
dataset = "text"
path = "/usr/share/common-licenses/GPL-3"
[training]
steps = 4
global_batch_size = 12
micro_batch_size = 2
optimizer = "adamw"
lr = 0.003
grad_clip = 1.0
eval_batches = 2
threads = 1
[checkpoint]
interval = 2
)";

TEST(PipelineSharding, OptimizerShardsWithinStagesTrainTheUnshardedGridBitForBit) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun on this machine";
  TempDir dir;
  const std::string config = dir.write("job.toml", kStagedGpt);
  const std::string log = dir.path("log.txt");
  // AdamW at 2 and 3 replicas; bf16 autocast and SGD with momentum (one state tensor) at 2.
  for (const auto& [replicas, options] : {std::pair<int, std::string>{2, ""}, {3, ""},
                                          {2, "--training.mixed_precision=bf16 --training.optimizer=sgd "
                                              "--training.momentum=0.9 --training.lr=0.05 "}}) {
    SCOPED_TRACE(std::to_string(replicas) + " replicas of 2 stages " + options);
    const std::string grid =
        mpirun(2 * replicas) + HT_BINARY + " " + config + " --parallel.pipeline_parallel=2 " + options;
    const std::string name = std::to_string(replicas) + (options.empty() ? "" : "_bf16");
    const std::string plain = dir.path("plain" + name);
    const std::string sharded = dir.path("sharded" + name);
    ASSERT_EQ(run(grid + "--job.output_dir=" + plain), 0);
    ASSERT_EQ(run_logged(grid + "--parallel.shard=optimizer --job.output_dir=" + sharded, log), 0) << read_file(log);
    EXPECT_THAT(read_file(log), HasSubstr("(slices of " + std::to_string(2 * replicas) + " ranks"));
    EXPECT_THAT(read_file(log), ::testing::Not(HasSubstr("has no effect")));
    expect_same_model(plain + "/checkpoints/step_00000004", sharded + "/checkpoints/step_00000004");
    if (replicas == 2 && options.empty()) {
      // Rank 0 (stage 0) gives up the AdamW state (8 bytes an element) of its replica's half of
      // the stage: its peak falls by exactly that (the planner's state term, docs/parallelism.md).
      const double elements = last_train_number(sharded + "/metrics.jsonl", "shard_elements");
      EXPECT_GT(elements, 0);
      EXPECT_EQ(last_train_number(plain + "/metrics.jsonl", "mem_peak_bytes") -
                    last_train_number(sharded + "/metrics.jsonl", "mem_peak_bytes"),
                8 * elements);
    }
  }
}

// Resumed from step 2 in every direction, the run ends where the uninterrupted one does: the
// slices hold each piece's AdamW moments and step, and a whole checkpoint gives each rank its share.
TEST(PipelineSharding, SlicesAndWholeCheckpointsResumeEitherWay) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun on this machine";
  TempDir dir;
  const std::string config = dir.write("job.toml", kStagedGpt);
  const std::string log = dir.path("log.txt");
  const std::string grid = mpirun(4) + HT_BINARY + " " + config + " --parallel.pipeline_parallel=2 ";
  const std::string sharded = grid + "--parallel.shard=optimizer ";
  ASSERT_EQ(run(grid + "--job.output_dir=" + dir.path("plain")), 0);
  // (The checkpoint of step 2 of a 4-step run: the learning rate's schedule depends on the steps.)
  ASSERT_EQ(run(sharded + "--job.output_dir=" + dir.path("s")), 0);
  const std::string slices = dir.path("s/checkpoints/step_00000002");
  ASSERT_TRUE(std::filesystem::exists(slices + "/rank_00003.slices"));
  const std::string end = "/checkpoints/step_00000004";
  // Slices, sharded as they were written.
  ASSERT_EQ(run_logged(sharded + "--checkpoint.resume=" + slices + " --job.output_dir=" + dir.path("s_s"), log), 0)
      << read_file(log);
  EXPECT_THAT(read_file(log), HasSubstr("resumed from " + slices + " at step 2"));
  expect_same_model(dir.path("plain") + end, dir.path("s_s") + end);
  // Slices into the unsharded grid (its rank 0 reads every stage's).
  ASSERT_EQ(run(grid + "--checkpoint.resume=" + slices + " --job.output_dir=" + dir.path("s_plain")), 0);
  expect_same_model(dir.path("plain") + end, dir.path("s_plain") + end);
  // A whole checkpoint into the sharded grid.
  ASSERT_EQ(run(sharded + "--checkpoint.resume=" + dir.path("plain/checkpoints/step_00000002") +
                " --job.output_dir=" + dir.path("plain_s")),
            0);
  expect_same_model(dir.path("plain") + end, dir.path("plain_s") + end);
  // Slices into 2 sharded ranks without stages: the tied weight's two gradients sum in another
  // order there (within fp32 rounding).
  ASSERT_EQ(run(mpirun(2) + HT_BINARY + " " + config + " --parallel.shard=optimizer --checkpoint.resume=" + slices +
                " --job.output_dir=" + dir.path("s_dp")),
            0);
  expect_same_model(dir.path("plain") + end, dir.path("s_dp") + end, 1e-5);
}

// ZeRO-2 and ZeRO-3 with stages stay refused, naming both keys and why (exit 2).
TEST(PipelineSharding, GradientAndParameterShardsWithStagesAreRefused) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun on this machine";
  TempDir dir;
  const std::string config = dir.write("job.toml", kStagedGpt);
  const std::string log = dir.path("log.txt");
  for (const std::string level : {"gradients", "parameters"}) {
    const int rc = run_logged(mpirun(2) + HT_BINARY + " " + config + " --parallel.pipeline_parallel=2 --parallel.shard=" +
                                  level + " --job.output_dir=" + dir.path(level),
                              log);
    EXPECT_EQ(WEXITSTATUS(rc), 2) << read_file(log);
    EXPECT_THAT(read_file(log), HasSubstr("parallel.shard = \"" + level + "\" with parallel.pipeline_parallel = 2"));
    EXPECT_THAT(read_file(log), HasSubstr("use parallel.shard = \"optimizer\" with stages"));
    EXPECT_FALSE(std::filesystem::exists(dir.path(level + "/checkpoints")));
  }
}

}  // namespace
}  // namespace ht::test

// training.gradient_dtype = "bf16" (ZeRO's 16-bit gradients): the gradient block, the shards and
// the reductions in bf16. Within one micro-batch a rank's sums are the same at every sharding level
// (each reduction sums the ranks' bf16 values in fp32 and rounds once), so the levels train the
// same bits; a budget changes no bit; the run's predicted peak is its measured one within 0.5%;
// and the gradients' bytes are half fp32's.
#include "tests/support/mpi_job.h"
#include "tests/support/temp_dir.h"

namespace ht::test {
namespace {

void expect_predicted_within_half_a_percent(const std::string& metrics, const std::string& what) {
  const int64_t predicted = last_number(metrics, "predicted_peak_bytes"), measured = last_number(metrics, "mem_peak_bytes");
  ASSERT_GT(measured, 0) << what;
  EXPECT_LE(std::abs(predicted - measured), measured / 200) << what << ": predicted " << predicted << ", measured " << measured;
}

const char* kBf16 = " --training.optimizer=adamw --training.mixed_precision=bf16 --training.grad_clip=0.5";

// 2 ranks, one micro-batch of 32 each: every level with bf16 gradients trains the unsharded run's
// bits; each level's peak is below its fp32 gradients' peak by the bytes it keeps of them halved
// (the block on every rank, or ZeRO-2/3's shard), and it reduces half the bytes. (At 3 ranks an
// all-reduce and a reduce-scatter may add the ranks' fp32 values in other orders: the levels then
// agree within bf16's rounding, not to the bit.)
TEST(GradientDtypeJob, Bf16GradientsTrainTheSameBitsAtEveryLevelInFewerBytes) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun on this machine";
  TempDir dir;
  const std::string job = mpirun(2) + HT_BINARY + " " + dir.write("job.toml", kEightLayerLlama) + kBf16 +
                          " --training.micro_batch_size=32 --memory.budget=1GiB --memory.policy=none";
  std::string reference;
  for (const std::string level : {"none", "optimizer", "gradients", "parameters"}) {
    SCOPED_TRACE(level);
    const std::string sharded = job + " --parallel.shard=" + level;
    ASSERT_EQ(run(sharded + " --training.gradient_dtype=bf16 --job.output_dir=" + dir.path(level)), 0);
    ASSERT_EQ(run(sharded + " --training.gradient_dtype=fp32 --job.output_dir=" + dir.path(level + "32")), 0);
    const std::string metrics = read_file(dir.path(level + "/metrics.jsonl"));
    expect_predicted_within_half_a_percent(metrics, level);
    const std::string folder = dir.path(level + "/checkpoints/step_00000003");
    if (reference.empty()) {
      reference = folder;
    } else {
      expect_same_model(reference, folder);
    }
    // 2 bytes a parameter saved where every rank keeps the whole block, 2/N where it keeps a shard
    // (up to the arena's rounding of each block and shard).
    const int64_t parameters = last_number(read_file(dir.path(level + "/summary.json")), "parameters");
    ASSERT_GT(parameters, 0);
    const int64_t fp32_peak = last_number(read_file(dir.path(level + "32/metrics.jsonl")), "mem_peak_bytes");
    const int64_t saved = fp32_peak - last_number(metrics, "mem_peak_bytes");
    const int64_t expected = level == "none" || level == "optimizer" ? 2 * parameters : parameters;
    EXPECT_NEAR(static_cast<double>(saved), static_cast<double>(expected), 1024.0) << level;
    // Half the bytes reduced.
    EXPECT_EQ(2 * last_number(metrics, "comm_bytes"), last_number(read_file(dir.path(level + "32/metrics.jsonl")), "comm_bytes"))
        << level;
  }
  // fp32 gradients train another model (not the same bits): the type did change.
  const auto a = read_model(reference), b = read_model(dir.path("none32/checkpoints/step_00000003"));
  bool differs = false;
  for (const auto& [key, t] : a) differs = differs || !at::equal(t, b.at(key));
  EXPECT_TRUE(differs);
}

// One rank, 2 micro-batches a step (the second accumulated into the bf16 block): under DTR at 40%
// of the activations the same bits as with room to spare.
TEST(GradientDtypeJob, Bf16GradientsUnderDtrAtFortyPercentChangeNoBit) {
  TempDir dir;
  const std::string job = HT_BINARY + (" " + dir.write("job.toml", kEightLayerLlama)) + kBf16 +
                          " --training.gradient_dtype=bf16 --training.global_batch_size=32";
  ASSERT_EQ(run(job + " --memory.budget=1GiB --job.output_dir=" + dir.path("roomy")), 0);
  const std::string roomy = read_file(dir.path("roomy/metrics.jsonl"));
  // bf16 gradients in effect: 2 bytes a parameter under fp32's peak.
  ASSERT_EQ(run(job + " --training.gradient_dtype=fp32 --memory.budget=1GiB --job.output_dir=" + dir.path("fp32")), 0);
  const int64_t parameters = last_number(read_file(dir.path("roomy/summary.json")), "parameters");
  EXPECT_NEAR(static_cast<double>(last_number(read_file(dir.path("fp32/metrics.jsonl")), "mem_peak_bytes") -
                                  last_number(roomy, "mem_peak_bytes")),
              static_cast<double>(2 * parameters), 1024.0);
  expect_predicted_within_half_a_percent(roomy, "roomy");
  const int64_t peak = last_number(roomy, "mem_peak_bytes"), activations = last_number(roomy, "activation_peak_bytes");
  ASSERT_GT(activations, 0);
  const int64_t budget = peak - activations * 6 / 10;
  ASSERT_EQ(run(job + " --memory.policy=dtr --memory.budget=" + std::to_string(budget) + " --job.output_dir=" +
                dir.path("dtr")),
            0);
  expect_same_model(dir.path("roomy/checkpoints/step_00000003"), dir.path("dtr/checkpoints/step_00000003"));
  EXPECT_GT(last_number(read_file(dir.path("dtr/metrics.jsonl")), "evictions"), 0) << "the budget made DTR evict";
}

}  // namespace
}  // namespace ht::test

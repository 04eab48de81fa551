// `mpirun -np N hybrid_train --parallel.shard=optimizer` (ZeRO-1): each rank keeps the optimizer
// state of its share of the parameters only, and trains bit for bit what the unsharded
// data-parallel run trains (the same all-reduce; AdamW and SGD step element by element); each
// rank writes its slices of the checkpoint, read back at any rank count, sharded or not.
// ZeRO-2 (gradients) and ZeRO-3 (parameters) reduce-scatter every micro-batch: the unsharded
// model within fp32's rounding.
#include "tests/support/mpi_job.h"
#include "tests/support/temp_dir.h"

namespace ht::test {
namespace {

using ::testing::HasSubstr;

// Two buckets of 1 MiB (363 k parameters), AdamW, clipping that bites (grad_clip 0.5).
const char* kMlp = R"([model]
name = "mlp"
hidden = [512, 384]
[data]
dataset = "synthetic"
synthetic_samples = 240
synthetic_eval_samples = 48
synthetic_shape = [3, 8, 8]
synthetic_classes = 5
[training]
steps = 4
global_batch_size = 12
optimizer = "adamw"
lr = 0.01
warmup_steps = 2
grad_clip = 0.5
threads = 1
[parallel]
bucket_mb = 1
[checkpoint]
interval = 2
keep = 3
)";

// A checkpoint's model (either layout: a sharded run writes slices), tensor by tensor as bytes:
// equal strings are the same model bit for bit.
std::string model_at(const TempDir& dir, const std::string& run, int step) {
  char name[32];
  std::snprintf(name, sizeof name, "step_%08d", step);
  const std::string folder = dir.path(run + "/checkpoints/" + name);
  if (!std::filesystem::is_directory(folder)) return "";
  std::string bytes;
  for (const auto& [key, tensor] : read_model(folder)) {
    const at::Tensor t = tensor.contiguous();
    bytes += key;
    bytes.append(static_cast<const char*>(t.data_ptr()), static_cast<size_t>(t.numel()) * t.element_size());
  }
  return bytes;
}

// Every tensor of two checkpoints' models within fp32 reduction-order tolerance. AdamW divides each
// update by the root of its second moment, so for an element whose gradients are near zero a
// rounding-level difference in them moves the update by a share of lr (0.01 here): 4 steps, at
// most 5e-5 absolute.
void expect_close_models(const std::string& a, const std::string& b) { ht::test::expect_close_models(a, b, 1e-4, 5e-5); }

// Within one level a budget changes no bit: the 8-layer Llama sharded on 2 ranks, evicting under
// DTR at 40% of its peak, against the same sharded job with room to spare.
void expect_dtr_at_forty_percent_changes_no_bit(const std::string& level) {
  TempDir dir;
  const std::string job = mpirun(2) + HT_BINARY + " " + dir.write("job.toml", kEightLayerLlama) +
                          " --training.optimizer=adamw --parallel.shard=" + level;
  ASSERT_EQ(run(job + " --memory.budget=1GiB --job.output_dir=" + dir.path("roomy")), 0);
  const int64_t peak = last_number(read_file(dir.path("roomy/metrics.jsonl")), "mem_peak_bytes");
  ASSERT_GT(peak, 0);
  ASSERT_EQ(run(job + " --memory.policy=dtr --memory.budget=" + std::to_string(peak * 2 / 5) + " --job.output_dir=" +
                dir.path("dtr")),
            0);
  EXPECT_TRUE(model_at(dir, "roomy", 3) == model_at(dir, "dtr", 3)) << level << ": model.pt differs";
  EXPECT_THAT(read_file(dir.path("dtr/metrics.jsonl")), ::testing::Not(HasSubstr("\"evictions\": 0,")))
      << level << ": the budget made DTR evict";
  if (level == "parameters") {
    // The memory manager dropped gathered buckets beside activations, and recomputations and
    // backward gathered them again: both ranks at the same points (or the job would hang), and
    // more bytes came in than by FSDP's rule without eviction.
    const std::string dtr = read_file(dir.path("dtr/metrics.jsonl"));
    EXPECT_GT(last_number(dtr, "parameter_drops"), 0);
    EXPECT_GT(last_number(dtr, "gather_bytes"), last_number(read_file(dir.path("roomy/metrics.jsonl")), "gather_bytes"));
  }
}

// The run's predicted peak (the planner's terms for its level) within 2% of its measured one.
void expect_predicted_peak_within_two_percent(const std::string& metrics) {
  const int64_t predicted = last_number(metrics, "predicted_peak_bytes"), measured = last_number(metrics, "mem_peak_bytes");
  ASSERT_GT(measured, 0);
  EXPECT_LE(std::abs(predicted - measured), measured / 50) << "predicted " << predicted << ", measured " << measured;
}

// bf16, 2 micro-batches per rank (a reduce-scatter each, added into the shards), SGD with momentum
// and uneven shards (3 ranks), under a budget that never evicts: the unsharded model within fp32's
// rounding, auto's 16-bit copies kept (under ZeRO-3 the shards', gathered in 16 bits, one block
// prefetched), and the planner's peak for `level` within 0.5% (measured 2026-12-03: -0.06% at
// ZeRO-2 and ZeRO-3; ZeRO-3 had been +6.4% while backward was priced as gathering again every
// bucket's copies, a first layer's too, whose input needs no gradient).
void expect_bf16_accumulation_on_three_ranks(const std::string& level) {
  TempDir dir;
  const std::string job = mpirun(3) + HT_BINARY + " " + dir.write("job.toml", kMlp) +
                          " --training.optimizer=sgd --training.momentum=0.9 --training.mixed_precision=bf16 "
                          "--training.micro_batch_size=2 --training.lr=0.05";
  ASSERT_EQ(run(job + " --job.output_dir=" + dir.path("whole")), 0);
  ASSERT_EQ(run(job + " --parallel.shard=" + level + " --memory.budget=1GiB --job.output_dir=" + dir.path("sharded")), 0);
  expect_close_models(dir.path("whole/checkpoints/step_00000004"),
                      dir.path("sharded/checkpoints/step_00000004"));
  const std::string metrics = read_file(dir.path("sharded/metrics.jsonl"));
  EXPECT_GT(last_number(metrics, "weight_copies_bytes"), 0) << "auto kept no copies";
  const int64_t predicted = last_number(metrics, "predicted_peak_bytes"), measured = last_number(metrics, "mem_peak_bytes");
  ASSERT_GT(measured, 0);
  EXPECT_LE(std::abs(predicted - measured), measured / 200) << "predicted " << predicted << ", measured " << measured;
}

class ShardedJob : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (run("mpirun --version") != 0) GTEST_SKIP() << "no mpirun on this machine";
  }
};

TEST_P(ShardedJob, OptimizerStateShardsTrainTheUnshardedModelBitForBit) {
  const int ranks = GetParam();
  TempDir dir;
  const std::string job = mpirun(ranks) + HT_BINARY + " " + dir.write("job.toml", kMlp);
  ASSERT_EQ(run(job + " --job.output_dir=" + dir.path("whole")), 0);
  ASSERT_EQ(run(job + " --parallel.shard=optimizer --job.output_dir=" + dir.path("sharded")), 0);
  const std::string whole = model_at(dir, "whole", 4);
  ASSERT_FALSE(whole.empty());
  EXPECT_TRUE(whole == model_at(dir, "sharded", 4)) << "model.pt differs at " << ranks << " ranks";
  // Each rank updates its share: rank 0 (the fullest) at most one element per bucket over 1/N.
  const std::string metrics = read_file(dir.path("sharded/metrics.jsonl"));
  const int64_t parameters = 192 * 512 + 512 + 512 * 384 + 384 + 384 * 5 + 5;
  const int64_t share = last_number(metrics, "shard_elements");
  EXPECT_GE(share, parameters / ranks);
  EXPECT_LE(share, parameters / ranks + 2);
  EXPECT_GT(last_number(metrics, "gather_bytes"), 0);
  // A third of AdamW's state per rank less (two of every four fp32 copies of the model):
  // the memory it saves shows in the rank's peak.
  const int64_t saved = 8 * (parameters - share);
  EXPECT_LE(last_number(metrics, "mem_peak_bytes"),
            last_number(read_file(dir.path("whole/metrics.jsonl")), "mem_peak_bytes") - saved * 9 / 10);
}

// ZeRO-2: each bucket reduce-scattered, not all-reduced; the sums are the same within fp32's
// rounding, and the step over the shards (the global norm summed from the ranks' pieces, so a
// clipping scale that differs in its last bits; clipping bites here) trains the same model.
TEST_P(ShardedJob, GradientShardsTrainTheUnshardedModel) {
  const int ranks = GetParam();
  TempDir dir;
  const std::string job = mpirun(ranks) + HT_BINARY + " " + dir.write("job.toml", kMlp);
  ASSERT_EQ(run(job + " --job.output_dir=" + dir.path("whole")), 0);
  ASSERT_EQ(run(job + " --parallel.shard=gradients --job.output_dir=" + dir.path("sharded")), 0);
  expect_close_models(dir.path("whole/checkpoints/step_00000004"),
                      dir.path("sharded/checkpoints/step_00000004"));
  const std::string sharded = read_file(dir.path("sharded/metrics.jsonl"));
  const std::string whole = read_file(dir.path("whole/metrics.jsonl"));
  EXPECT_GT(last_number(sharded, "shard_elements"), 0);
  EXPECT_GT(last_number(sharded, "comm_bytes"), 0);
  // The gradient block (4 bytes a parameter) is gone, but for one bucket's block while backward
  // fills it (1 MiB buckets): the rank's peak shows at least half of what that saves.
  const int64_t parameters = 192 * 512 + 512 + 512 * 384 + 384 + 384 * 5 + 5;
  const int64_t saved = 8 * (parameters - last_number(sharded, "shard_elements")) + 4 * parameters - (1 << 20);
  EXPECT_LE(last_number(sharded, "mem_peak_bytes"), last_number(whole, "mem_peak_bytes") - saved / 2)
      << "whole " << last_number(whole, "mem_peak_bytes") << ", sharded " << last_number(sharded, "mem_peak_bytes");
}

// ZeRO-3: the parameters too live as each rank's share, gathered a block at a time where they
// are read; the unsharded model within fp32's rounding, a peak below ZeRO-2's (from 3 ranks),
// predicted within 2%.
TEST_P(ShardedJob, ParameterShardsTrainTheUnshardedModel) {
  const int ranks = GetParam();
  TempDir dir;
  const std::string job = mpirun(ranks) + HT_BINARY + " " + dir.write("job.toml", kMlp);
  ASSERT_EQ(run(job + " --job.output_dir=" + dir.path("whole")), 0);
  ASSERT_EQ(run(job + " --parallel.shard=gradients --job.output_dir=" + dir.path("gradients")), 0);
  ASSERT_EQ(run(job + " --parallel.shard=parameters --job.output_dir=" + dir.path("sharded")), 0);
  ASSERT_EQ(run(job + " --parallel.shard=parameters --parallel.prefetch=0 --job.output_dir=" + dir.path("inline")), 0);
  expect_close_models(dir.path("whole/checkpoints/step_00000004"),
                      dir.path("sharded/checkpoints/step_00000004"));
  // Prefetched gathers (the default) copy the same shards: not a bit moves.
  EXPECT_TRUE(model_at(dir, "sharded", 4) == model_at(dir, "inline", 4)) << "prefetch changed the model";
  const std::string sharded = read_file(dir.path("sharded/metrics.jsonl"));
  EXPECT_GT(last_number(sharded, "gather_bytes"), 0);
  EXPECT_THAT(sharded, HasSubstr("\"gather_hidden\": "));
  const int64_t measured = last_number(sharded, "mem_peak_bytes");
  expect_predicted_peak_within_two_percent(sharded);
  // At 2 ranks the largest block (hidden1, over half the parameters), gathered whole, outweighs the
  // half of the parameters a rank gives up: no gain there, as the planner also says.
  if (ranks >= 3) {
    EXPECT_LT(measured, last_number(read_file(dir.path("gradients/metrics.jsonl")), "mem_peak_bytes"));
  }
}

INSTANTIATE_TEST_SUITE_P(TwoThreeAndFourRanks, ShardedJob, ::testing::Values(2, 3, 4));

// The planner's peak for the level: the shards and the largest bucket's block for the gradient
// block (measured equal to the byte when this test was written).
TEST(ShardedJobComposition, GradientShardsWithAccumulationAndBf16OnThreeRanks) {
  if (run("mpirun --version") != 0) GTEST_SKIP() << "no mpirun on this machine";
  expect_bf16_accumulation_on_three_ranks("gradients");
}

// Overlapped reduce-scatters (the default: parallel.overlap) add the same sums in the same order as
// reduce-scatters waited for where backward starts them: the same bits, at 3 ranks (uneven shards)
// with 3 micro-batches a rank (each bucket's later parts added into its sum).
TEST(ShardedJobComposition, OverlappedReduceScattersChangeNoBit) {
  if (run("mpirun --version") != 0) GTEST_SKIP() << "no mpirun on this machine";
  TempDir dir;
  const std::string job = mpirun(3) + HT_BINARY + " " + dir.write("job.toml", kMlp) +
                          " --parallel.shard=gradients --training.micro_batch_size=2";
  ASSERT_EQ(run(job + " --job.output_dir=" + dir.path("during")), 0);
  ASSERT_EQ(run(job + " --parallel.overlap=false --job.output_dir=" + dir.path("after")), 0);
  EXPECT_TRUE(model_at(dir, "during", 4) == model_at(dir, "after", 4)) << "overlap changed the model";
  EXPECT_THAT(read_file(dir.path("after/metrics.jsonl")), HasSubstr("\"overlap\": 0,"));
}

// ZeRO-2's buckets end where blocks do, and the planner places each one's gradient block along the
// traced step: overlapped, a block stays until the next bucket's reduce-scatter starts, beside a
// part of its shard's size from the second micro-batch on (GradientShards). The run's own
// prediction is its peak within 0.5%, overlapped or not (3 ranks, 2 micro-batches each). A
// resident bucket beside the activations' peak had been 5.8% under overlapped here, and
// ResNet-18's size-cut buckets 5.5% under.
TEST(ShardedJobComposition, GradientBlocksArePredictedOverlappedOrNot) {
  if (run("mpirun --version") != 0) GTEST_SKIP() << "no mpirun on this machine";
  TempDir dir;
  const std::string job = mpirun(3) + HT_BINARY + " " + dir.write("job.toml", kMlp) +
                          " --parallel.shard=gradients --training.micro_batch_size=2 --memory.budget=1GiB";
  for (const std::string overlap : {"true", "false"}) {
    SCOPED_TRACE("parallel.overlap = " + overlap);
    ASSERT_EQ(run(job + " --parallel.overlap=" + overlap + " --job.output_dir=" + dir.path(overlap)), 0);
    const std::string metrics = read_file(dir.path(overlap + "/metrics.jsonl"));
    const int64_t predicted = last_number(metrics, "predicted_peak_bytes"), measured = last_number(metrics, "mem_peak_bytes");
    ASSERT_GT(measured, 0);
    EXPECT_LE(std::abs(predicted - measured), measured / 200) << "predicted " << predicted << ", measured " << measured;
  }
}

// Within the level a budget changes no bit: the buckets' blocks are made under the budget while
// backward regenerates what DTR evicted.
TEST(ShardedJobComposition, GradientShardsUnderDtrAtFortyPercentChangeNoBit) {
  if (run("mpirun --version") != 0) GTEST_SKIP() << "no mpirun on this machine";
  expect_dtr_at_forty_percent_changes_no_bit("gradients");
}

// ZeRO-3 under DTR at 40%: gathered buckets stay until the memory manager drops them, weighed
// beside activations; evictions weigh modelled costs, so both ranks decide alike and gather what a
// recomputation or backward reads at the same points.
TEST(ShardedJobComposition, ParameterShardsUnderDtrAtFortyPercentChangeNoBit) {
  if (run("mpirun --version") != 0) GTEST_SKIP() << "no mpirun on this machine";
  expect_dtr_at_forty_percent_changes_no_bit("parameters");
}

// The same with one rank sharing its core with a busy loop: a loaded rank times its kernels
// differently, but eviction weighs modelled costs, so both ranks still evict, recompute and
// gather at the same points (else the job hangs or differs).
TEST(ShardedJobComposition, ParameterShardsUnderDtrWithOneRankLoaded) {
  if (run("mpirun --version") != 0) GTEST_SKIP() << "no mpirun on this machine";
  TempDir dir;
  const std::string args = dir.write("job.toml", kEightLayerLlama) +
                           " --training.optimizer=adamw --parallel.shard=parameters";
  ASSERT_EQ(run(mpirun(2) + HT_BINARY + " " + args + " --memory.budget=1GiB --job.output_dir=" + dir.path("roomy")), 0);
  const int64_t peak = last_number(read_file(dir.path("roomy/metrics.jsonl")), "mem_peak_bytes");
  ASSERT_GT(peak, 0);
  const std::string dtr = std::string(HT_BINARY) + " " + args + " --memory.policy=dtr --memory.budget=" +
                          std::to_string(peak * 2 / 5) + " --job.output_dir=" + dir.path("loaded");
  // MPMD: rank 0 as it is, rank 1 beside `yes` on the same cores.
  ASSERT_EQ(run(mpirun(1) + dtr + " : -np 1 sh -c 'yes > /dev/null & y=$!; " + dtr + "; r=$?; kill $y; exit $r'"), 0);
  EXPECT_TRUE(model_at(dir, "roomy", 3) == model_at(dir, "loaded", 3)) << "model.pt differs";
  EXPECT_THAT(read_file(dir.path("loaded/metrics.jsonl")), ::testing::Not(HasSubstr("\"evictions\": 0,")));
}

// ZeRO-3 with bf16 (auto's 16-bit copies: each bucket's shard rounded and gathered in 16 bits), 2
// micro-batches per rank, SGD with momentum on uneven shards, under a budget that never evicts:
// the unsharded model within fp32's rounding, and the planner's peak for the level within 0.5%.
TEST(ShardedJobComposition, ParameterShardsWithAccumulationAndBf16OnThreeRanks) {
  if (run("mpirun --version") != 0) GTEST_SKIP() << "no mpirun on this machine";
  expect_bf16_accumulation_on_three_ranks("parameters");
}

// ZeRO-3 gathering 16-bit copies (training.compute_weights = "kept": each bucket's shard rounded
// once a step, all-gathered in bf16; the norms' gains alone in fp32) trains what gathering fp32 and
// casting at each read trains, bit for bit, with about half the bytes gathered; and under DTR at
// 60% of its peak (gathered copies dropped and gathered again beside the activations) no bit moves.
// The planner prices its peak (the walk along the step without the weights' casts).
TEST(ShardedJobComposition, ParameterShardsGatherBf16CopiesBitForBitAsTheCasts) {
  if (run("mpirun --version") != 0) GTEST_SKIP() << "no mpirun on this machine";
  TempDir dir;
  const std::string job = mpirun(2) + HT_BINARY + " " + dir.write("job.toml", kEightLayerLlama) +
                          " --training.optimizer=adamw --parallel.shard=parameters --training.mixed_precision=bf16";
  ASSERT_EQ(run(job + " --training.compute_weights=cast --memory.budget=1GiB --job.output_dir=" + dir.path("cast")), 0);
  ASSERT_EQ(run(job + " --training.compute_weights=kept --memory.budget=1GiB --job.output_dir=" + dir.path("kept")), 0);
  const std::string cast = read_file(dir.path("cast/metrics.jsonl")), kept = read_file(dir.path("kept/metrics.jsonl"));
  const int64_t peak = last_number(cast, "mem_peak_bytes");
  ASSERT_GT(peak, 0);
  ASSERT_EQ(run(job + " --training.compute_weights=kept --memory.policy=dtr --memory.budget=" +
                std::to_string(peak * 6 / 10) + " --job.output_dir=" + dir.path("dtr")),
            0);
  const std::string model = model_at(dir, "cast", 3);
  ASSERT_FALSE(model.empty());
  EXPECT_TRUE(model == model_at(dir, "kept", 3)) << "the 16-bit gathers trained another model";
  EXPECT_TRUE(model == model_at(dir, "dtr", 3)) << "DTR with 16-bit gathers trained another model";
  EXPECT_LT(last_number(kept, "gather_bytes"), last_number(cast, "gather_bytes") * 6 / 10);
  EXPECT_GT(last_number(kept, "weight_copies_bytes"), 0) << "the 16-bit shards";
  expect_predicted_peak_within_two_percent(kept);  // to the byte on 2026-12-03
  EXPECT_THAT(read_file(dir.path("dtr/metrics.jsonl")), ::testing::Not(HasSubstr("\"evictions\": 0,")));
}

// A tied embedding under ZeRO-3's 16-bit gathers (auto's in bf16): the output layer's saved copy of
// the table is gathered again in backward, the fp32 table the lookup read is not (the lookup saves
// only the indices). With a vocabulary of 2000 (the table 256 kB in fp32) the planner had priced
// the fp32 table as held through backward, +4.8%; measured to the byte on 2026-12-03.
TEST(ShardedJobComposition, ATiedTableIsNotGatheredAgainInFp32) {
  if (run("mpirun --version") != 0) GTEST_SKIP() << "no mpirun on this machine";
  TempDir dir;
  ASSERT_EQ(run(mpirun(2) + HT_BINARY + " " + dir.write("gpt.toml", kTinyGpt) +
                " --parallel.shard=parameters --training.mixed_precision=bf16 --memory.budget=1GiB"
                " --data.synthetic_classes=2000 --job.output_dir=" + dir.path("run")),
            0);
  const std::string metrics = read_file(dir.path("run/metrics.jsonl"));
  EXPECT_GT(last_number(metrics, "weight_copies_bytes"), 0) << "auto kept no copies";
  const int64_t predicted = last_number(metrics, "predicted_peak_bytes"), measured = last_number(metrics, "mem_peak_bytes");
  ASSERT_GT(measured, 0);
  EXPECT_LE(std::abs(predicted - measured), measured / 200) << "predicted " << predicted << ", measured " << measured;
}

// ZeRO-1 and ZeRO-2 with 16-bit copies kept shard the fp32 weights with the optimizer (Megatron's
// distributed optimizer): each rank steps its share of the masters, rounds it once a step and
// all-gathers the 16-bit copies (the norms' gains in fp32), held until the next step. 2 ranks, then
// 4 resuming their checkpoint (the masters' slices read at another count): bit for bit what
// keeping every fp32 weight and casting at each read trains, with about half the bytes gathered,
// the planner's peak within 2%.
TEST(ShardedJobComposition, MastersShardedAtZeroOneAndTwoTrainTheBitsOfTheCasts) {
  if (run("mpirun --version") != 0) GTEST_SKIP() << "no mpirun on this machine";
  TempDir dir;
  const std::string config = dir.write("job.toml", kEightLayerLlama);
  const std::string flags = " --training.optimizer=adamw --training.mixed_precision=bf16 --memory.budget=1GiB "
                            "--memory.policy=none --checkpoint.interval=2 --training.steps=4";
  for (const std::string level : {"optimizer", "gradients"}) {
    const std::string job = HT_BINARY + (" " + config) + flags + " --parallel.shard=" + level;
    for (const std::string mode : {"cast", "kept"}) {
      const std::string out = " --training.compute_weights=" + mode + " --job.output_dir=" + dir.path(level + mode);
      ASSERT_EQ(run(mpirun(2) + job + out + " --training.steps=2"), 0) << level << " " << mode;
      ASSERT_EQ(run(mpirun(4) + job + out + " --checkpoint.resume=latest"), 0) << level << " " << mode;
    }
    const std::string cast = read_file(dir.path(level + "cast/metrics.jsonl"));
    const std::string kept = read_file(dir.path(level + "kept/metrics.jsonl"));
    const std::string model = model_at(dir, level + "cast", 4);
    ASSERT_FALSE(model.empty());
    EXPECT_TRUE(model == model_at(dir, level + "kept", 4)) << level << ": sharded masters trained another model";
    // The gathered copies (2 bytes for every bucketed weight, no 16-bit shard beside them), and their
    // gathers with the norms' gains in fp32: about half of the fp32 parameters' gathers.
    EXPECT_GT(last_number(kept, "weight_copies_bytes"), 2 * (4 - 1) * last_number(kept, "shard_elements")) << level;
    EXPECT_LT(last_number(kept, "gather_bytes"), last_number(cast, "gather_bytes") * 6 / 10) << level;
    expect_predicted_peak_within_two_percent(kept);
  }
}

// 2 ranks, then 3, then 4, each resuming the last one's checkpoint: sharded, the chain ends on
// the unsharded chain's model, bit for bit (each step's reduction is the same; only the state's
// split changes: each rank writes its slices, and the next count reads the ranges of its own
// pieces); at ZeRO-2, whose sums add in another order, within fp32's rounding. Then one rank,
// unsharded, resumes both chains' last checkpoints (slices assembled whole) to the same model.
TEST(ShardedJobResume, AcrossTwoThreeAndFourRanksAsTheUnshardedChain) {
  if (run("mpirun --version") != 0) GTEST_SKIP() << "no mpirun on this machine";
  TempDir dir;
  const std::string config = dir.write("job.toml", kMlp);
  for (const std::string shard : {"none", "optimizer", "gradients", "parameters"}) {
    const std::string out = " --parallel.shard=" + shard + " --job.output_dir=" + dir.path(shard);
    ASSERT_EQ(run(mpirun(2) + HT_BINARY + " " + config + out + " --training.steps=2"), 0);
    ASSERT_EQ(run(mpirun(3) + HT_BINARY + " " + config + out + " --training.steps=4 --checkpoint.resume=latest"), 0);
    ASSERT_EQ(run(mpirun(4) + HT_BINARY + " " + config + out + " --training.steps=6 --checkpoint.resume=latest"), 0);
  }
  const std::string whole = model_at(dir, "none", 6);
  ASSERT_FALSE(whole.empty());
  EXPECT_TRUE(whole == model_at(dir, "optimizer", 6)) << "the model differs after 2 -> 3 -> 4 ranks";
  const std::string sliced = dir.path("optimizer/checkpoints/step_00000006/");
  EXPECT_TRUE(std::filesystem::exists(sliced + "rank_00003.slices") && !std::filesystem::exists(sliced + "model.pt"))
      << "each of the 4 ranks wrote its slices, and nothing whole";
  // ZeRO-2 and ZeRO-3 resume the same way, within their tolerance.
  expect_close_models(dir.path("none/checkpoints/step_00000006"), dir.path("gradients/checkpoints/step_00000006"));
  expect_close_models(dir.path("none/checkpoints/step_00000006"), dir.path("parameters/checkpoints/step_00000006"));
  for (const std::string chain : {"none", "optimizer"}) {
    ASSERT_EQ(run(std::string(HT_BINARY) + " " + config + " --training.steps=8 --checkpoint.resume=latest --job.output_dir=" +
                  dir.path(chain)),
              0);
  }
  EXPECT_TRUE(model_at(dir, "none", 8) == model_at(dir, "optimizer", 8)) << "one rank resumed the slices differently";
}

// AdamW's moments in bf16 (training.optimizer_state_dtype): ZeRO-1's slices hold them in bf16
// (half the state's bytes) and resume across rank counts as the unsharded chain does, bit for bit;
// one rank told to keep them in fp32 reads both chains' bf16 moments and goes on to one model.
TEST(ShardedJobResume, Bf16MomentsResumeFromTheirSlices) {
  if (run("mpirun --version") != 0) GTEST_SKIP() << "no mpirun on this machine";
  TempDir dir;
  const std::string config = dir.write("job.toml", kMlp);
  for (const std::string chain : {"none_bf16", "optimizer_bf16", "optimizer_fp32"}) {
    const std::string moments = chain.substr(chain.size() - 4), shard = chain.substr(0, chain.size() - 5);
    const std::string out = " --training.optimizer_state_dtype=" + moments + " --parallel.shard=" + shard +
                            " --job.output_dir=" + dir.path(chain);
    ASSERT_EQ(run(mpirun(2) + HT_BINARY + " " + config + out + " --training.steps=2"), 0);
    ASSERT_EQ(run(mpirun(3) + HT_BINARY + " " + config + out + " --training.steps=4 --checkpoint.resume=latest"), 0);
  }
  const std::string whole = model_at(dir, "none_bf16", 4);
  ASSERT_FALSE(whole.empty());
  EXPECT_TRUE(whole == model_at(dir, "optimizer_bf16", 4)) << "the model differs after 2 -> 3 ranks";
  EXPECT_FALSE(whole == model_at(dir, "optimizer_fp32", 4)) << "bf16 moments round: another model";
  auto slice_bytes = [&](const std::string& run_name) {
    uintmax_t bytes = 0;
    for (int r = 0; r < 3; ++r) {
      bytes += std::filesystem::file_size(dir.path(run_name + "/checkpoints/step_00000004/rank_0000" +
                                                   std::to_string(r) + ".slices"));
    }
    return bytes;
  };
  // The parameters (4 bytes each) and the moments: 8 bytes in fp32, 4 in bf16.
  const double ratio = static_cast<double>(slice_bytes("optimizer_bf16")) / static_cast<double>(slice_bytes("optimizer_fp32"));
  EXPECT_NEAR(ratio, 8.0 / 12.0, 0.01) << "the slices hold the moments in bf16";
  for (const std::string chain : {"none_bf16", "optimizer_bf16"}) {
    ASSERT_EQ(run(std::string(HT_BINARY) + " " + config + " --training.steps=6 --checkpoint.resume=latest " +
                  "--training.optimizer_state_dtype=fp32 --job.output_dir=" + dir.path(chain)),
              0);
  }
  EXPECT_TRUE(model_at(dir, "none_bf16", 6) == model_at(dir, "optimizer_bf16", 6))
      << "one rank read the slices' bf16 moments differently";
}

// bf16, 3 micro-batches per rank, SGD with momentum (one state tensor, not AdamW's two), and
// uneven shards (3 ranks): still the unsharded model.
TEST(ShardedJobComposition, Bf16AccumulationAndSgdOnThreeRanks) {
  if (run("mpirun --version") != 0) GTEST_SKIP() << "no mpirun on this machine";
  TempDir dir;
  const std::string job = mpirun(3) + HT_BINARY + " " + dir.write("job.toml", kMlp) +
                          " --training.optimizer=sgd --training.momentum=0.9 --training.mixed_precision=bf16 "
                          "--training.micro_batch_size=2 --training.lr=0.05";
  ASSERT_EQ(run(job + " --job.output_dir=" + dir.path("whole")), 0);
  ASSERT_EQ(run(job + " --parallel.shard=optimizer --job.output_dir=" + dir.path("sharded")), 0);
  EXPECT_TRUE(model_at(dir, "whole", 4) == model_at(dir, "sharded", 4)) << "model.pt differs";
}

// memory.optimizer_state = "host" moves the rank's share only (half of AdamW's 8 bytes a parameter
// at 2 ranks), and changes no bit.
TEST(ShardedJobComposition, TheStateOnHostIsTheRanksShare) {
  if (run("mpirun --version") != 0) GTEST_SKIP() << "no mpirun on this machine";
  TempDir dir;
  const std::string job = mpirun(2) + HT_BINARY + " " + dir.write("job.toml", kMlp) +
                          " --memory.budget=12MiB --memory.policy=hybrid --memory.optimizer_state=host";
  ASSERT_EQ(run(job + " --job.output_dir=" + dir.path("whole")), 0);
  ASSERT_EQ(run(job + " --parallel.shard=optimizer --job.output_dir=" + dir.path("sharded")), 0);
  EXPECT_TRUE(model_at(dir, "whole", 4) == model_at(dir, "sharded", 4)) << "model.pt differs";
  const std::string metrics = read_file(dir.path("sharded/metrics.jsonl"));
  EXPECT_EQ(last_number(metrics, "state_out_bytes"), 8 * last_number(metrics, "shard_elements"));
}

// ZeRO-1 under DTR at 40% (expect_dtr_at_forty_percent_changes_no_bit).
TEST(ShardedJobComposition, DtrAtFortyPercentChangesNoBit) {
  if (run("mpirun --version") != 0) GTEST_SKIP() << "no mpirun on this machine";
  expect_dtr_at_forty_percent_changes_no_bit("optimizer");
}

// The planner knows the level: 2 ranks whose whole state (4.54 MiB) and optimizer temporaries
// do not fit 5 MiB are refused with a sharded plan that does, and strategy = "auto" trains it,
// predicting its peak to within the arena's rounding.
TEST(ShardedJobPlanning, ARefusalNamesAShardedPlanAndAutoTrainsIt) {
  if (run("mpirun --version") != 0) GTEST_SKIP() << "no mpirun on this machine";
  TempDir dir;
  const std::string job = mpirun(2) + HT_BINARY + " " + dir.write("job.toml", kMlp) + " --memory.budget=5MiB";
  const std::string log = dir.path("log.txt");
  // memory.policy = "none": the budget is a hard limit (alone, it trains the planner's policy).
  EXPECT_NE(std::system((job + " --memory.policy=none --job.output_dir=" + dir.path("refused") + " > " + log + " 2>&1").c_str()), 0);
  EXPECT_THAT(read_file(log), HasSubstr("does not fit memory.budget = \"5MiB\""));
  EXPECT_THAT(read_file(log), HasSubstr("parallel.shard = \"gradients\" peaks at"));
  ASSERT_EQ(run(job + " --parallel.strategy=auto --job.output_dir=" + dir.path("auto")), 0);
  const std::string metrics = read_file(dir.path("auto/metrics.jsonl"));
  EXPECT_GT(last_number(metrics, "shard_elements"), 0) << "the plan it trained is sharded";
  const int64_t predicted = last_number(metrics, "predicted_peak_bytes"), measured = last_number(metrics, "mem_peak_bytes");
  EXPECT_LE(std::abs(predicted - measured), 64) << "predicted " << predicted << ", measured " << measured;
}

// `hybrid_train export` assembles a sharded run's slices as it reads a whole checkpoint: a GPT
// trained with ZeRO-1 on 3 ranks exports the very file the unsharded run does.
TEST(ShardedJobExport, AShardedRunExportsTheUnshardedRunsSafetensors) {
  if (run("mpirun --version") != 0) GTEST_SKIP() << "no mpirun on this machine";
  TempDir dir;
  const std::string config = dir.write("gpt.toml", kTinyGpt);
  for (const std::string shard : {"none", "optimizer"}) {
    ASSERT_EQ(run(mpirun(3) + HT_BINARY + " " + config + " --training.global_batch_size=12 --training.steps=3 " +
                  "--checkpoint.interval=3 --parallel.shard=" + shard + " --job.output_dir=" + dir.path(shard)), 0);
    ASSERT_EQ(run(std::string(HT_BINARY) + " export " + dir.path(shard)), 0) << shard;
  }
  const std::string whole = read_file(dir.path("none/hf/model.safetensors"));
  ASSERT_FALSE(whole.empty());
  EXPECT_TRUE(whole == read_file(dir.path("optimizer/hf/model.safetensors"))) << "the exported weights differ";
  // ZeRO-3's slices likewise, its values the unsharded run's within rounding.
  ASSERT_EQ(run(mpirun(3) + HT_BINARY + " " + config + " --training.global_batch_size=12 --training.steps=3 " +
                "--checkpoint.interval=3 --parallel.shard=parameters --job.output_dir=" + dir.path("parameters")), 0);
  ASSERT_EQ(run(std::string(HT_BINARY) + " export " + dir.path("parameters")), 0);
  EXPECT_EQ(read_file(dir.path("parameters/hf/model.safetensors")).size(), whole.size());
}

TEST(ShardedJobErrors, PoliciesLevelsCannotComposeWithPipelinesAndOneRank) {
  TempDir dir;
  const std::string config = dir.write("job.toml", kMlp);
  const std::string log = dir.path("log.txt");
  auto fails_with = [&](const std::string& args, const std::string& text) {
    const int rc = std::system((std::string(HT_BINARY) + " " + config + " " + args + " --job.output_dir=" +
                                dir.path("x") + " > " + log + " 2>&1").c_str());
    EXPECT_EQ(WEXITSTATUS(rc), 2) << args;
    EXPECT_THAT(read_file(log), HasSubstr(text));
  };
  fails_with("--parallel.shard=parameters --memory.policy=hybrid --memory.budget=64MiB",
             "parallel.shard = \"parameters\" with memory.policy = \"hybrid\": host swap decides by when copies "
             "finish, which differs between ranks");
  fails_with("--parallel.shard=parameters --memory.policy=segments --memory.budget=64MiB",
             "parallel.shard = \"parameters\" with memory.policy = \"segments\": a static plan places every tensor");
  fails_with("--parallel.shard=parameters --memory.policy=dtr --memory.budget=64MiB --memory.kernel_costs=measured",
             "parallel.shard = \"parameters\" with memory.kernel_costs = \"measured\": measured times differ "
             "between ranks");
  fails_with("--parallel.shard=gradients --memory.policy=static --memory.budget=64MiB",
             "parallel.shard = \"gradients\" with memory.policy = \"static\": a static plan places every tensor of "
             "a captured step");
  fails_with("--parallel.shard=everything", "parallel.shard");
  fails_with("--parallel.shard=parameters --parallel.prefetch=-1", "parallel.prefetch");
  // One rank: a warning, and the run trains.
  ASSERT_EQ(std::system((std::string(HT_BINARY) + " " + config + " --parallel.shard=optimizer --training.steps=1 " +
                         "--checkpoint.interval=0 --job.output_dir=" + dir.path("one") + " > " + log + " 2>&1").c_str()),
            0);
  EXPECT_THAT(read_file(log), HasSubstr("warning: parallel.shard = \"optimizer\" has no effect with one "
                                        "data-parallel rank"));
  ASSERT_EQ(std::system((std::string(HT_BINARY) + " " + config + " --parallel.prefetch=2 --training.steps=1 " +
                         "--checkpoint.interval=0 --job.output_dir=" + dir.path("two") + " > " + log + " 2>&1").c_str()),
            0);
  EXPECT_THAT(read_file(log), HasSubstr("parallel.prefetch has no effect: it applies only when parallel.shard = "
                                        "\"parameters\""));
  if (run("mpirun --version") != 0) return;
  const int rc = std::system((mpirun(2) + HT_BINARY + " " + config + " --parallel.shard=gradients " +
                              "--parallel.pipeline_parallel=2 --job.output_dir=" + dir.path("y") + " > " + log +
                              " 2>&1").c_str());
  EXPECT_EQ(WEXITSTATUS(rc), 2);
  EXPECT_THAT(read_file(log), HasSubstr("parallel.shard = \"gradients\" with parallel.pipeline_parallel = 2: sharded "
                                        "gradients are reduce-scattered during every micro-batch's backward"));
  EXPECT_NE(std::system((mpirun(2) + HT_BINARY + " " + config + " --parallel.shard=parameters " +
                         "--parallel.pipeline_parallel=2 --job.output_dir=" + dir.path("z") + " > " + log + " 2>&1").c_str()),
            0);
  EXPECT_THAT(read_file(log), HasSubstr("parallel.shard = \"parameters\" with parallel.pipeline_parallel = 2"));
  // Slices of another model, and of another optimizer's state: refused on resume, naming why.
  ASSERT_EQ(run(mpirun(2) + HT_BINARY + " " + config + " --parallel.shard=optimizer --training.steps=2 --job.output_dir=" +
                dir.path("s")),
            0);
  const std::string resume = " --checkpoint.resume=latest --training.steps=4 --job.output_dir=" + dir.path("s");
  EXPECT_EQ(WEXITSTATUS(std::system((mpirun(2) + HT_BINARY + " " + config + " --parallel.shard=parameters " +
                                     "--model.hidden=[512,256]" + resume + " > " + log + " 2>&1").c_str())),
            2);
  EXPECT_THAT(read_file(log), HasSubstr("this checkpoint does not fit the configured model or optimizer: "
                                        "hidden1.linear.weight is Float[384, 512] there but Float[256, 512]"));
  EXPECT_EQ(WEXITSTATUS(std::system((mpirun(2) + HT_BINARY + " " + config + " --parallel.shard=gradients " +
                                     "--training.optimizer=sgd --training.momentum=0.9" + resume + " > " + log + " 2>&1")
                                        .c_str())),
            2);
  EXPECT_THAT(read_file(log), HasSubstr("its optimizer state is adamw's"));
}

}  // namespace
}  // namespace ht::test

// Cutting a model into pipeline stages by profiled cost: known optima worked out by hand, the
// memory limit and in-flight counts, a brute-force check on random profiles, the errors' advice,
// the user's override and the start-up table.
#include "parallel/stage_partition.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>

namespace ht {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

// Blocks with the given forward+backward ms (all in forward) and nothing else.
std::vector<BlockCost> timed(const std::vector<double>& ms) {
  std::vector<BlockCost> blocks;
  for (size_t i = 0; i < ms.size(); ++i) {
    BlockCost b;
    b.name = "b" + std::to_string(i);
    b.forward_ms = ms[i];
    blocks.push_back(b);
  }
  return blocks;
}

BlockCost block(const std::string& name, double forward_ms, double backward_ms, int64_t parameters) {
  BlockCost b;
  b.name = name;
  b.forward_ms = forward_ms;
  b.backward_ms = backward_ms;
  b.parameters = parameters;
  b.state_bytes = parameters * 16;  // fp32 parameter, gradient and two Adam moments
  return b;
}

// GPT-2 small-like: the embedding and the untied head hold 38.6M parameters each but the embedding
// is a cheap lookup (2 ms) and the head a vocabulary-wide matmul (24 ms); each layer h0..h11 holds
// 7.1M and takes 10 ms.
std::vector<BlockCost> gpt_like() {
  std::vector<BlockCost> blocks{block("embed", 0.5, 1.5, 38'600'000)};
  for (int i = 0; i < 12; ++i) blocks.push_back(block("h" + std::to_string(i), 3, 7, 7'100'000));
  blocks.push_back(block("head", 8, 16, 38'600'000));
  return blocks;
}

PartitionOptions stages(int count) {
  PartitionOptions options;
  options.stages = count;
  return options;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected std::invalid_argument";
  return "";
}

TEST(StagePartition, KnownOptimumOfOneToNine) {
  // Costs 1..9 (total 45) in 3 stages. The last stage holds 9: alone (9), the other two cover
  // 1..8 = 36 and one of them takes >= 18; with 8 ({8,9} = 17) the rest 1..7 = 28 splits as
  // {1..5} = 15, {6,7} = 13; with 7 too ({7,8,9} = 24) it is already worse. So 17, and
  // {1..5},{6,7},{8,9} is the only split reaching it ({1..4} leaves {5,6,7} = 18).
  const Partition p = balance_stages(timed({1, 2, 3, 4, 5, 6, 7, 8, 9}), stages(3));
  EXPECT_EQ(stage_block_counts(p), (std::vector<int>{5, 2, 2}));
  EXPECT_DOUBLE_EQ(p.slowest_ms, 17);
  EXPECT_DOUBLE_EQ(p.mean_ms, 15);
  ASSERT_EQ(p.stages.size(), 3u);
  EXPECT_EQ(p.stages[1].first_block, 5);
  EXPECT_DOUBLE_EQ(p.stages[0].ms, 15);
  EXPECT_DOUBLE_EQ(p.stages[1].ms, 13);
}

TEST(StagePartition, TimeBalanceBeatsParameterBalanceWithHeavyEmbeddingAndHead) {
  // By parameters (162.4M, 4 stages): embed + 1 layer is 45.7M, so the embedding and the head
  // stay alone (38.6M) and the 12 layers split 6/6 (42.6M; 5/7 gives 49.7M): {1,6,6,1},
  // ms 2, 60, 60, 24 -> slowest 60.
  // By time (146 ms): below 40, middle stages hold <= 3 layers, embed + 3 (32), 1 + head (34):
  // only 10 layers fit, so 40 is optimal, reached only by embed+3, 4, 4, 1+head: {4,4,4,2}.
  const auto blocks = gpt_like();
  const Partition by_time = balance_stages(blocks, stages(4));
  const Partition by_params = partition_by_parameters(blocks, stages(4));
  EXPECT_EQ(stage_block_counts(by_params), (std::vector<int>{1, 6, 6, 1}));
  EXPECT_DOUBLE_EQ(by_params.slowest_ms, 60);
  EXPECT_EQ(by_params.stages[1].parameters, 42'600'000);
  EXPECT_EQ(stage_block_counts(by_time), (std::vector<int>{4, 4, 4, 2}));
  EXPECT_DOUBLE_EQ(by_time.slowest_ms, 40);
  EXPECT_LT(by_time.slowest_ms, by_params.slowest_ms);
  EXPECT_DOUBLE_EQ(by_time.mean_ms, by_params.mean_ms) << "the same work, spread differently";
}

TEST(StagePartition, TiesGoToTheSmallerPeakThenTheEarliestCut) {
  // ms {10,1,1,1} in 3 stages: {10},{1},{1,1} and {10},{1,1},{1} both reach 10.
  auto blocks = timed({10, 1, 1, 1});
  EXPECT_EQ(stage_block_counts(balance_stages(blocks, stages(3))), (std::vector<int>{1, 1, 2}))
      << "no peaks to tell them apart: the earliest cut";
  // State {0,1,1,5} MiB: {1,1,2} peaks at 6 MiB on its last stage, {1,2,1} at 5 MiB.
  const int64_t state[] = {0, 1, 1, 5};
  for (int i = 0; i < 4; ++i) blocks[i].state_bytes = state[i] * kMiB;
  const Partition p = balance_stages(blocks, stages(3));
  EXPECT_EQ(stage_block_counts(p), (std::vector<int>{1, 2, 1}));
  EXPECT_EQ(p.stages[2].peak_bytes, 5 * kMiB);
}

TEST(StagePartition, MemoryLimitMovesACut) {
  // 6 blocks of 1 ms; the first holds 10 MiB of state, the others 1 MiB. Unlimited: {3,3}
  // (slowest 3) but its first stage needs 12 MiB. At 11 MiB: {2,4} (11 and 4 MiB, slowest 4)
  // beats {1,5} (slowest 5).
  auto blocks = timed({1, 1, 1, 1, 1, 1});
  blocks[0].state_bytes = 10 * kMiB;
  for (int i = 1; i < 6; ++i) blocks[i].state_bytes = kMiB;
  const Partition fastest = balance_stages(blocks, stages(2));
  EXPECT_EQ(stage_block_counts(fastest), (std::vector<int>{3, 3}));
  EXPECT_EQ(fastest.stages[0].peak_bytes, 12 * kMiB);

  PartitionOptions options = stages(2);
  options.memory_limit_bytes = 11 * kMiB;
  const Partition fitting = balance_stages(blocks, options);
  EXPECT_EQ(stage_block_counts(fitting), (std::vector<int>{2, 4}));
  EXPECT_DOUBLE_EQ(fitting.slowest_ms, 4);
  for (const StagePlan& s : fitting.stages) EXPECT_LE(s.peak_bytes, options.memory_limit_bytes);
}

TEST(StagePartition, InFlightCountsPerStageMatter) {
  // 8 blocks of 1 ms, 1 MiB of activations each, 1F1B on 4 stages: 4, 3, 2, 1 micro-batches in
  // flight. Limit 6 MiB. With 1 in flight everywhere {2,2,2,2} fits (2 MiB each). Here stage 0
  // can take 1 block only (2 would hold 8 MiB), so 2 ms is out; at 3 ms stage 1 takes <= 2,
  // stage 2 <= 3, stage 3 <= 3. Every such split peaks at 6 MiB (a lower peak leaves room for 7
  // blocks only), so the earliest cuts win: {1,1,3,3}, peaks 4, 3, 6, 3 MiB.
  std::vector<BlockCost> blocks = timed(std::vector<double>(8, 1));
  for (BlockCost& b : blocks) b.activation_bytes = kMiB;
  PartitionOptions options = stages(4);
  options.memory_limit_bytes = 6 * kMiB;
  const Partition uniform = balance_stages(blocks, options);
  EXPECT_EQ(stage_block_counts(uniform), (std::vector<int>{2, 2, 2, 2}));
  EXPECT_EQ(uniform.stages[0].peak_bytes, 2 * kMiB);

  options.in_flight = one_f_one_b_in_flight(4, 8);
  ASSERT_EQ(options.in_flight, (std::vector<int>{4, 3, 2, 1}));
  const Partition p = balance_stages(blocks, options);
  EXPECT_EQ(stage_block_counts(p), (std::vector<int>{1, 1, 3, 3}));
  EXPECT_DOUBLE_EQ(p.slowest_ms, 3);
  const std::vector<int64_t> peaks{4 * kMiB, 3 * kMiB, 6 * kMiB, 3 * kMiB};
  for (int s = 0; s < 4; ++s) EXPECT_EQ(p.stages[s].peak_bytes, peaks[s]) << "stage " << s;
}

TEST(StagePartition, InFlightHelpers) {
  EXPECT_EQ(one_f_one_b_in_flight(4, 2), (std::vector<int>{2, 2, 2, 1})) << "no more than the step's micro-batches";
  EXPECT_EQ(gpipe_in_flight(3, 8), (std::vector<int>{8, 8, 8}));
  EXPECT_THROW(one_f_one_b_in_flight(0, 4), std::invalid_argument);
}

// Every way to cut n blocks into `count` non-empty contiguous stages.
void compositions(int n, int count, std::vector<int>& prefix, std::vector<std::vector<int>>& out) {
  if (count == 1) {
    prefix.push_back(n);
    out.push_back(prefix);
    prefix.pop_back();
    return;
  }
  for (int first = 1; first + count - 1 <= n; ++first) {
    prefix.push_back(first);
    compositions(n - first, count - 1, prefix, out);
    prefix.pop_back();
  }
}

struct Brute {
  bool found = false;
  double slowest = 0;
  int64_t peak = 0;     // smallest largest peak among the fastest
  int64_t params = -1;  // smallest largest parameter count, limit ignored
};

// The optimum by trying every split, costs summed here independently of the library.
Brute brute_force(const std::vector<BlockCost>& blocks, const PartitionOptions& options) {
  std::vector<std::vector<int>> splits;
  std::vector<int> prefix;
  compositions(static_cast<int>(blocks.size()), options.stages, prefix, splits);
  Brute best;
  for (const auto& counts : splits) {
    double slowest = 0;
    int64_t peak = 0, params = 0;
    bool fits = true;
    for (int s = 0, first = 0; s < options.stages; first += counts[s++]) {
      double ms = 0;
      int64_t state = 0, activation = 0, p = 0;
      for (int i = first; i < first + counts[s]; ++i) {
        ms += blocks[i].forward_ms + blocks[i].backward_ms;
        state += blocks[i].state_bytes;
        activation += blocks[i].activation_bytes;
        p += blocks[i].parameters;
      }
      const int64_t stage_peak = state + activation * options.in_flight[s];
      fits = fits && (options.memory_limit_bytes == 0 || stage_peak <= options.memory_limit_bytes);
      slowest = std::max(slowest, ms);
      peak = std::max(peak, stage_peak);
      params = std::max(params, p);
    }
    if (best.params < 0 || params < best.params) best.params = params;
    if (fits && (!best.found || slowest < best.slowest || (slowest == best.slowest && peak < best.peak))) {
      best.found = true;
      best.slowest = slowest;
      best.peak = peak;
    }
  }
  return best;
}

std::vector<BlockCost> random_profile(std::mt19937& rng, int n) {
  std::uniform_real_distribution<double> ms(0.0, 10.0);
  std::uniform_int_distribution<int64_t> bytes(0, 100), params(0, 1000);
  std::vector<BlockCost> blocks;
  for (int i = 0; i < n; ++i) {
    BlockCost b;
    b.name = "b" + std::to_string(i);
    b.forward_ms = ms(rng);
    b.backward_ms = ms(rng);
    b.activation_bytes = bytes(rng);
    b.state_bytes = bytes(rng);
    b.parameters = params(rng);
    blocks.push_back(b);
  }
  return blocks;
}

TEST(StagePartition, MatchesBruteForceOnRandomProfiles) {
  std::mt19937 rng(20240611);
  int fitted = 0, refused = 0;
  for (int trial = 0; trial < 600; ++trial) {
    const int n = std::uniform_int_distribution<int>(1, 9)(rng);
    const auto blocks = random_profile(rng, n);
    PartitionOptions options = stages(std::uniform_int_distribution<int>(1, std::min(4, n))(rng));
    for (int s = 0; s < options.stages; ++s) options.in_flight.push_back(std::uniform_int_distribution<int>(1, 4)(rng));
    // A third unlimited; the rest anywhere from hopeless to generous.
    if (trial % 3) options.memory_limit_bytes = std::uniform_int_distribution<int64_t>(1, 1500)(rng);
    const Brute brute = brute_force(blocks, options);
    EXPECT_EQ(partition_by_parameters(blocks, options).stages.size(), static_cast<size_t>(options.stages));
    int64_t largest_params = 0;
    for (const StagePlan& s : partition_by_parameters(blocks, options).stages)
      largest_params = std::max(largest_params, s.parameters);
    EXPECT_EQ(largest_params, brute.params) << "trial " << trial;
    if (!brute.found) {
      EXPECT_THROW(balance_stages(blocks, options), std::invalid_argument) << "trial " << trial;
      ++refused;
      continue;
    }
    const Partition p = balance_stages(blocks, options);
    ++fitted;
    EXPECT_DOUBLE_EQ(p.slowest_ms, brute.slowest) << "trial " << trial;
    int64_t peak = 0, blocks_covered = 0;
    for (const StagePlan& s : p.stages) {
      EXPECT_EQ(s.first_block, blocks_covered) << "contiguous";
      EXPECT_GE(s.blocks, 1);
      blocks_covered += s.blocks;
      peak = std::max(peak, s.peak_bytes);
      if (options.memory_limit_bytes) {
        EXPECT_LE(s.peak_bytes, options.memory_limit_bytes);
      }
    }
    EXPECT_EQ(blocks_covered, n);
    EXPECT_EQ(peak, brute.peak) << "trial " << trial << ": the tie-break by peak";
  }
  EXPECT_GT(fitted, 100);
  EXPECT_GT(refused, 10) << "the limits drawn should also exercise the refusal";
}

TEST(StagePartition, TooManyStagesSaysHowMany) {
  const auto blocks = timed({1, 2, 3});
  EXPECT_EQ(error_of([&] { balance_stages(blocks, stages(4)); }),
            "3 blocks cannot make 4 stages: at most 3 stages, or a model with more blocks");
  EXPECT_NE(error_of([&] { balance_stages(blocks, stages(0)); }).find(">= 1"), std::string::npos);
  EXPECT_NE(error_of([&] { partition_by_parameters(blocks, stages(4)); }).find("at most 3 stages"), std::string::npos);
}

TEST(StagePartition, ImpossibleLimitSaysWhatWouldFit) {
  // 6 blocks of 1 MiB in 2 stages need 3 MiB each; at 2 MiB, 3 stages would fit.
  auto blocks = timed({1, 1, 1, 1, 1, 1});
  for (BlockCost& b : blocks) b.state_bytes = kMiB;
  PartitionOptions options = stages(2);
  options.memory_limit_bytes = 2 * kMiB;
  const std::string message = error_of([&] { balance_stages(blocks, options); });
  EXPECT_NE(message.find("smallest limit that fits is 3.0 MiB"), std::string::npos) << message;
  EXPECT_NE(message.find("3 stages would fit"), std::string::npos) << message;
  EXPECT_EQ(smallest_stage_limit_bytes(blocks, options), 3 * kMiB);
  // Both suggestions work.
  options.stages = 3;
  EXPECT_EQ(balance_stages(blocks, options).stages.size(), 3u);
  options.stages = 2;
  options.memory_limit_bytes = 3 * kMiB;
  EXPECT_EQ(stage_block_counts(balance_stages(blocks, options)), (std::vector<int>{3, 3}));

  // A block that alone exceeds the limit: no number of stages helps, and the message says which.
  blocks[0].name = "embed";
  blocks[0].state_bytes = 10 * kMiB;
  options.memory_limit_bytes = 5 * kMiB;
  const std::string hopeless = error_of([&] { balance_stages(blocks, options); });
  EXPECT_NE(hopeless.find("smallest limit that fits is 10.0 MiB"), std::string::npos) << hopeless;
  EXPECT_NE(hopeless.find("'embed' alone needs 10.0 MiB"), std::string::npos) << hopeless;
}

TEST(StagePartition, OverrideErrorsSayWhatIsExpected) {
  const auto blocks = timed({1, 1, 1, 1, 1, 1});
  const std::string count = error_of([&] { partition_from_counts(blocks, {3, 3}, stages(3)); });
  EXPECT_NE(count.find("3 numbers summing to 6"), std::string::npos) << count;
  const std::string zero = error_of([&] { partition_from_counts(blocks, {3, 0, 3}, stages(3)); });
  EXPECT_NE(zero.find("stage 1"), std::string::npos) << zero;
  EXPECT_NE(zero.find("at least 1 block"), std::string::npos) << zero;
  const std::string negative = error_of([&] { partition_from_counts(blocks, {4, -1, 3}, stages(3)); });
  EXPECT_NE(negative.find("at least 1 block"), std::string::npos) << negative;
  const std::string sum = error_of([&] { partition_from_counts(blocks, {3, 2, 2}, stages(3)); });
  EXPECT_NE(sum.find("sums to 7"), std::string::npos) << sum;
  EXPECT_NE(sum.find("must sum to 6"), std::string::npos) << sum;
}

TEST(StagePartition, OverrideIsHonouredExactlyEvenOverTheLimit) {
  const auto blocks = gpt_like();
  PartitionOptions options = stages(4);
  options.in_flight = one_f_one_b_in_flight(4, 8);
  options.memory_limit_bytes = 1;  // nothing fits: the override is still the user's call
  const std::vector<int> counts{2, 5, 5, 2};
  const Partition p = partition_from_counts(blocks, counts, options);
  EXPECT_EQ(stage_block_counts(p), counts);
  const std::vector<int> firsts{0, 2, 7, 12};
  const std::vector<double> ms{12, 50, 50, 34};
  for (int s = 0; s < 4; ++s) {
    EXPECT_EQ(p.stages[s].first_block, firsts[s]);
    EXPECT_DOUBLE_EQ(p.stages[s].ms, ms[s]);
    EXPECT_GT(p.stages[s].peak_bytes, options.memory_limit_bytes) << "reported, for the caller to warn";
  }
  EXPECT_EQ(p.stages[0].parameters, 45'700'000);
  EXPECT_EQ(p.stages[0].peak_bytes, 45'700'000 * 16) << "no activations in this profile";
  EXPECT_DOUBLE_EQ(p.slowest_ms, 50);
}

TEST(StagePartition, TableHasARowPerStageWithNames) {
  const auto blocks = gpt_like();
  const std::string table = format_stage_table(blocks, balance_stages(blocks, stages(4)));
  // {4,4,4,2}: embed..h2, h3..h6, h7..h10, h11..head; 40 ms slowest over a 36.5 ms mean.
  for (const char* row : {"embed..h2", "h3..h6", "h7..h10", "h11..head", "59.9M", "32.00", "34.00"})
    EXPECT_NE(table.find(row), std::string::npos) << row << " missing from\n" << table;
  EXPECT_NE(table.find("slowest/mean 1.10"), std::string::npos) << table;
  EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), 6) << "header, 4 stages, ratio:\n" << table;
  // Fixed width: the stage rows are as long as the header.
  const size_t header = table.find('\n');
  EXPECT_EQ(table.find('\n', header + 1) - header - 1, header) << table;
  EXPECT_THROW(format_stage_table(timed({1}), balance_stages(blocks, stages(4))), std::invalid_argument);
}

// A block's cost by the stage that runs it (AdaPipe's per-stage recomputation: the first stage's
// blocks twice as slow): the exact split of the stage-dependent costs, each stage priced by its own.
TEST(StagePartition, CostsThatDependOnTheStage) {
  const std::vector<std::vector<BlockCost>> at_stage{timed({6, 6, 6, 6}), timed({3, 3, 3, 3})};
  const Partition p = balance_stages(at_stage, stages(2));
  EXPECT_EQ(stage_block_counts(p), (std::vector<int>{1, 3})) << "6 and 9 (two blocks each: 12 and 6)";
  EXPECT_DOUBLE_EQ(p.slowest_ms, 9);
  EXPECT_DOUBLE_EQ(p.mean_ms, 7.5);
  // The same list on every stage: the one-list optimum.
  EXPECT_EQ(stage_block_counts(balance_stages({timed({1, 2, 3, 4}), timed({1, 2, 3, 4})}, stages(2))),
            stage_block_counts(balance_stages(timed({1, 2, 3, 4}), stages(2))));
  EXPECT_THROW(balance_stages(std::vector<std::vector<BlockCost>>{timed({1, 2})}, stages(2)), std::invalid_argument)
      << "one list per stage";
}

}  // namespace
}  // namespace ht

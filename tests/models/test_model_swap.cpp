// Host swap's contract, as DTR's: under a budget, copying activations to host memory and back
// (and recomputing what is not copied) trains bit-identically to the run without a budget, for
// every model, with both swap rules, at the budgets the DTR tests use; memory never exceeds the
// budget, host memory never exceeds its own, and nothing is left behind on either side.
#include "alloc/host_link.h"
#include "runtime/interpreter.h"
#include "tests/support/budget_training.h"
#include "tests/support/late_host_link.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <map>

namespace ht::test {
namespace {

constexpr int64_t kRoomy = int64_t{1} << 30;
constexpr int64_t kSwapBatch = 16;

const ModelCase& swap_case(const std::string& name) {
  for (const ModelCase& c : budget_cases())
    if (c.name == name) return c;
  throw std::invalid_argument(name);
}

SaverOptions swapping(SwapRule rule, double gbps, int64_t host_budget = int64_t{1} << 30,
                      std::shared_ptr<HostLink> link = nullptr) {
  SaverOptions savers;
  SwapOptions swap;
  swap.rule = rule;
  swap.link = link ? std::move(link) : std::make_shared<ModelledHostLink>(gbps);
  swap.host_budget_bytes = host_budget;
  swap.min_bytes = 0;  // small models: every saved tensor is a candidate
  savers.swap = swap;
  return savers;
}

const char* rule_name(SwapRule r) { return r == SwapRule::kConvAndMatmul ? "swap" : "hybrid"; }

using Case = std::tuple<std::string, SwapRule>;
class ModelSwap : public ::testing::TestWithParam<Case> {};

// The lowest ratios every DTR policy reaches with a margin (test_model_dtr.cpp's ceilings).
const std::map<std::string, std::vector<double>> kRatios{
    {"convnet", {0.95}}, {"resnet18", {0.8, 0.7}}, {"gpt", {0.8, 0.5}}, {"llama", {0.7, 0.5}}, {"supernet", {0.8, 0.65}}};

TEST_P(ModelSwap, BitIdenticalWithinBothBudgets) {
  const ModelCase& c = swap_case(std::get<0>(GetParam()));
  const SwapRule rule = std::get<1>(GetParam());
  const BudgetRun plain = train_in_budget(c, kRoomy, std::nullopt, 3, kSwapBatch);
  ASSERT_FALSE(plain.out_of_budget);
  for (double ratio : kRatios.at(c.name)) {
    const std::string what = std::string(rule_name(rule)) + " at " + std::to_string(ratio);
    const int64_t budget = budget_at(plain, ratio);
    const BudgetRun run = train_in_budget(c, budget, EvictionHeuristic::kDtr, 3, kSwapBatch, swapping(rule, 50));
    expect_identical(plain, run, what);
    EXPECT_LE(run.peak_in_use, budget) << what;
    EXPECT_EQ(run.in_use_after, plain.in_use_after) << what << ": device bytes left behind by a step";
    EXPECT_EQ(run.live_records_after, 0) << what;
    EXPECT_EQ(run.swap_stats.host_bytes, 0) << what << ": host bytes left behind";
    EXPECT_GT(run.swap_stats.copies_out, 0) << what;
    if (rule == SwapRule::kConvAndMatmul) {
      // vDNN's rule copies every saved convolution and matmul output, and eviction takes them first.
      EXPECT_GT(run.swap_stats.drops, 0) << what;
      EXPECT_GT(run.swap_stats.copies_in, 0) << what;
    }
    EXPECT_LE(run.swap_stats.bytes_in_hidden, run.swap_stats.bytes_in) << what;
    const SwapStats& k = run.swap_stats;
    std::printf("[ swapped  ] %s %s: %lld copies out (%lld KiB), %lld in (%lld prefetched, %lld KiB hidden of %lld), "
                "%lld drops, %lld recomputations, %.1f ms waiting\n",
                c.name.c_str(), what.c_str(), static_cast<long long>(k.copies_out), static_cast<long long>(k.bytes_out >> 10),
                static_cast<long long>(k.copies_in), static_cast<long long>(k.prefetched_in),
                static_cast<long long>(k.bytes_in_hidden >> 10), static_cast<long long>(k.bytes_in >> 10),
                static_cast<long long>(k.drops), static_cast<long long>(run.stats.recomputations), k.wait_ms);
  }
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::get<0>(info.param) + "_" + rule_name(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(AllModelsBothRules, ModelSwap,
                         ::testing::Combine(::testing::Values("convnet", "resnet18", "gpt", "llama", "supernet"),
                                            ::testing::Values(SwapRule::kConvAndMatmul, SwapRule::kHidden)),
                         case_name);

// A link so slow that copies are still running when their tensors are read: the reads wait for
// them, and training is still bit-identical.
TEST(ModelSwapLink, ReadsWaitForCopiesInFlight) {
  const ModelCase& c = swap_case("gpt");
  const BudgetRun plain = train_in_budget(c, kRoomy, std::nullopt, 2, kSwapBatch);
  const BudgetRun run =
      train_in_budget(c, budget_at(plain, 0.5), EvictionHeuristic::kDtr, 2, kSwapBatch, swapping(SwapRule::kConvAndMatmul, 0.2));
  expect_identical(plain, run, "a 0.2 GB/s link");
  EXPECT_GT(run.swap_stats.copies_in, 0);
}

// A link as asynchronous as a GPU's copy engines, whose copies finish late (two copies behind, or
// only when waited for), hold NaN until then and copy their source as it is then: host swap reads
// nothing before its copy came back and writes no source before its copy went out, with both rules.
TEST(ModelSwapLink, CopiesThatFinishLateTrainTheSameBits) {
  for (const char* model : {"gpt", "resnet18"}) {
    const ModelCase& c = swap_case(model);
    const BudgetRun plain = train_in_budget(c, kRoomy, std::nullopt, 2, kSwapBatch);
    for (SwapRule rule : {SwapRule::kConvAndMatmul, SwapRule::kHidden}) {
      for (int lag : {0, 2}) {
        const std::string what = std::string(model) + " " + rule_name(rule) + " lag " + std::to_string(lag);
        auto link = std::make_shared<LateHostLink>(lag);
        const BudgetRun run = train_in_budget(c, budget_at(plain, model == std::string("gpt") ? 0.5 : 0.7),
                                              EvictionHeuristic::kDtr, 2, kSwapBatch,
                                              swapping(rule, 50, int64_t{1} << 30, link));
        expect_identical(plain, run, what);
        link->finish_all();
        EXPECT_GT(link->stats(CopyDirection::kToHost).copies, 0) << what;
        if (rule == SwapRule::kConvAndMatmul) {
          EXPECT_GT(link->stats(CopyDirection::kToDevice).copies, 0) << what;
        }
        if (lag > 0) {
          EXPECT_GT(link->finished_late(), 0) << what;
        }
      }
    }
  }
}

// A host budget smaller than what the rule would copy: copies past it are not made (those
// tensors are recomputed), and host memory stays within it.
TEST(ModelSwapLink, HostBudgetIsRespected) {
  const ModelCase& c = swap_case("resnet18");
  const BudgetRun plain = train_in_budget(c, kRoomy, std::nullopt, 2, kSwapBatch);
  constexpr int64_t kHostBudget = 256 << 10;
  const BudgetRun run = train_in_budget(c, budget_at(plain, 0.7), EvictionHeuristic::kDtr, 2, kSwapBatch,
                                        swapping(SwapRule::kConvAndMatmul, 50, kHostBudget));
  expect_identical(plain, run, "a 256 KiB host budget");
  EXPECT_LE(run.swap_stats.peak_host_bytes, kHostBudget);
  EXPECT_GT(run.swap_stats.refused_host_full, 0);
  EXPECT_GT(run.swap_stats.copies_out, 0);
}

}  // namespace
}  // namespace ht::test

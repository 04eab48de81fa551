// Static plans' contract (memory/static_plan.h): a plan drops, recomputes and frees exactly what
// it says, so a step run by a plan trains bit-identically to the run without a budget, for every
// model, at every budget a plan fits; a supernet switches between its paths' plans and DTR; a
// shape that changes makes the step leave its plan (DTR finishes it) and a new plan follows.
#include "models/convnet.h"
#include "models/decoder.h"
#include "models/resnet.h"
#include "models/supernet.h"
#include "alloc/cpu_arena.h"
#include "alloc/cpu_device_allocator.h"
#include "memory/memory_manager.h"
#include "runtime/interpreter.h"
#include "tests/support/budget_training.h"

#include <gtest/gtest.h>

#include <cstdio>

namespace ht::test {
namespace {

constexpr int64_t kUnlimited = int64_t{1} << 30;  // reserved, not committed
constexpr int64_t kBatch = 16;
constexpr int kSteps = 4;

// Bit-identical, and each step ends holding what the unoptimized run holds, with no record alive.
void expect_identical_and_no_leaks(const BudgetRun& expected, const BudgetRun& got, const std::string& what) {
  expect_identical(expected, got, what);
  EXPECT_EQ(got.in_use_after, expected.in_use_after) << what << ": bytes left behind by a step";
  EXPECT_EQ(got.live_records_after, 0) << what;
}

SaverOptions with_plans(PlanSource source) {
  SaverOptions s;
  StaticPlanOptions p;
  p.source = source;
  // The same plan under any load: costs from the kernel model, not the clock, and the solver's
  // heuristic alone. With the MIP under a 1 s limit a loaded machine's CBC stopped at another
  // incumbent, whose layout fragmented the Llama at 0.5; with no limit its root node alone takes
  // minutes here. The MIP's own schedules are held on graphs in tests/schedule/test_schedule.cpp
  // and run through a job in test_tensor_parallel_job.cpp.
  p.modeled_costs = true;
  p.solve_time_limit_s = 0;
  s.static_plans = p;
  return s;
}

class ModelStatic : public ::testing::TestWithParam<std::string> {};

TEST_P(ModelStatic, PlannedStepsTrainBitIdentically) {
  for (const ModelCase& c : budget_cases()) {
    if (c.name != GetParam()) continue;
    const BudgetRun plain = train_in_budget(c, kUnlimited, std::nullopt, kSteps, kBatch);
    ASSERT_FALSE(plain.out_of_budget);
    for (double ratio : {0.8, 0.5, 0.3}) {
      const std::string what = c.name + " at " + std::to_string(ratio);
      const int64_t budget = budget_at(plain, ratio);
      const BudgetRun run = train_in_budget(c, budget, EvictionHeuristic::kDtr, kSteps, kBatch,
                                            with_plans(PlanSource::kSolver));
      // What is asserted: the cases below. The first step of a sequence runs under DTR, which
      // cannot train the convnet at 0.8, the supernet at 0.3, nor the transformers at 0.3 since
      // attention saves O(T) (its smallest DTR ratio is 0.30-0.34 now); the first planned step
      // runs on the arena's own placement (its layout is recorded then), which fragments
      // ResNet-18 at 0.3, and at 0.5 since the capture counts what a kernel evicted (its plan
      // is found now: a conv2d backward asks 262144 bytes, the largest free block is 251456)
      // (docs/status.md: what is not built).
      const bool asserted = c.name != "convnet" && ratio >= 0.5 && !(c.name == "resnet18" && ratio < 0.8);
      if (!asserted && run.out_of_budget) {
        std::printf("[ not held ] %s: %s\n", what.c_str(), run.failure.c_str());
        continue;
      }
      expect_identical_and_no_leaks(plain, run, what);
      const StaticPlanStats& p = run.plan_stats;
      std::printf("[ planned  ] %s: %lld plans, %lld hits, %lld diverged, %lld dropped, %lld recomputed, "
                  "%lld layout misses, %s %s, planned peak %lld, measured %lld, budget %lld\n",
                  what.c_str(), static_cast<long long>(p.plans), static_cast<long long>(p.plan_hits),
                  static_cast<long long>(p.plan_diverged), static_cast<long long>(p.plan_evictions),
                  static_cast<long long>(p.plan_recomputations), static_cast<long long>(p.layout_misses),
                  p.last_solver.c_str(), p.last_status.c_str(), static_cast<long long>(p.last_planned_peak),
                  static_cast<long long>(run.peak_in_use), static_cast<long long>(budget));
      EXPECT_GE(p.plans + p.unplannable, 1) << what;
      if (c.name != "supernet" && p.unplannable == 0) {
        // The first step makes a plan; optimizer state appears after it, and the plan, where it
        // no longer fits, is solved again before the second step runs on it.
        EXPECT_EQ(p.plan_hits, kSteps - 1) << what << ": every step after the first runs on a plan";
        EXPECT_GT(p.plan_evictions, 0) << what;
      }  // where no plan fits the budget the steps run under DTR, as they did before the plan
      // The supernet takes a new path nearly every step: its plans are made, rarely run.
    }
  }
}

TEST_P(ModelStatic, SegmentsTrainBitIdentically) {
  for (const ModelCase& c : budget_cases()) {
    if (c.name != GetParam()) continue;
    const BudgetRun plain = train_in_budget(c, kUnlimited, std::nullopt, kSteps, kBatch);
    const BudgetRun run = train_in_budget(c, kUnlimited, EvictionHeuristic::kDtr, kSteps, kBatch,
                                          with_plans(PlanSource::kSegments));
    expect_identical_and_no_leaks(plain, run, c.name + " in segments");
    EXPECT_GE(run.plan_stats.plans, 1);
    // The supernet takes another path every step: its plans never run (each step diverges).
    if (c.name != "supernet") {
      EXPECT_GT(run.plan_stats.plan_recomputations, 0) << "segments recompute what they dropped";
    }
    // Segments save memory where blocks are alike (GPT's layers, ResNet's stages); the convnet,
    // whose first block holds most of its activations, needs more with them than without.
    if (c.name == "gpt" || c.name == "llama" || c.name == "resnet18") {
      EXPECT_LT(run.plan_stats.last_planned_peak, plain.peak_in_use);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllModels, ModelStatic, ::testing::Values("convnet", "resnet18", "gpt", "llama", "supernet"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace ht::test

namespace ht::test {
namespace {

// A step whose shapes change leaves its plan at the first op that differs (DTR finishes it and
// the new sequence gets its own plan); going back to the first shape finds the first plan again.
// Losses are those of the run without a budget throughout.
TEST(StaticPlanReplay, DivergesOnANewShapeAndPlansAgain) {
  const ModelCase gpt{"gpt", [] { return std::make_shared<Decoder>(DecoderOptions::gpt2(17, 32, 4, 2, 32, 0.0)); }, nullptr};
  auto run = [&](int64_t capacity, bool plans, PlanSource source) {
    auto arena = std::make_shared<CpuArena>(capacity);
    ArenaScope device(arena);
    MemoryManager memory;
    Interpreter interp(InterpreterOptions{ExecutionMode::kInterpreted, 4}, &memory);
    MemoryOptions options = MemoryOptions::budget(arena, EvictionHeuristic::kDtr);
    if (plans) {
      StaticPlanOptions p;
      p.source = source;
      p.solve_time_limit_s = 1;
      options.static_plans = p;
    }
    memory.configure(options);
    at::manual_seed(4);
    std::shared_ptr<Model> model = gpt.make();
    model->set_block_listener([&memory](int block) { memory.block_begins(block); });
    GradientBuffer gradients(model->parameters());
    interp.set_gradient_buffer(&gradients);
    std::vector<double> losses;
    // Sequence lengths per step: two of 32, two of 16 (a new sequence), two of 32 again.
    for (int64_t t : {32, 32, 16, 16, 32, 32}) {
      at::manual_seed(100 + t);
      at::Tensor x = at::randint(17, {8, t}, at::kLong), y = at::randint(17, {8, t}, at::kLong);
      memory.begin_step();
      Tensor loss = model->loss(model->forward(interp.input(x)), interp.input(y));
      interp.backward(loss);
      losses.push_back(loss.value().item<double>());
      loss.reset();
      memory.end_step();
      clear_grads(*model);  // no optimizer: the fixed memory stays as it is, plans stay valid
    }
    const StaticPlanner* planner = memory.static_planner();
    return std::make_pair(losses, planner != nullptr ? planner->stats() : StaticPlanStats{});
  };
  const auto [plain_losses, none] = run(int64_t{1} << 30, false, PlanSource::kSolver);
  // Segments drop and recompute whatever the budget: the plan's actions are exercised for sure.
  const auto [losses, p] = run(int64_t{1} << 30, true, PlanSource::kSegments);
  EXPECT_EQ(plain_losses, losses);
  EXPECT_EQ(p.plans - p.plans_outgrown, 2) << "one plan per sequence (and any solved again as memory outside the step grew)";
  EXPECT_EQ(p.plan_diverged, 1) << "the first step of 16 left the plan of 32";
  EXPECT_EQ(p.plan_hits, 4) << "every later step found its sequence's plan";
  EXPECT_GT(p.plan_recomputations, 0);
}

}  // namespace
}  // namespace ht::test

// Pipeline schedules checked and simulated without a model: every generator is valid and free of
// deadlock on a grid of shapes, broken schedules are caught, and the simulated bubbles and
// activation peaks are what the literature says they are.
#include "parallel/pipeline_schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

namespace ht {
namespace {

using K = ActionKind;
constexpr ScheduleKind kKinds[] = {ScheduleKind::kGpipe, ScheduleKind::k1f1b, ScheduleKind::kInterleaved1f1b,
                                   ScheduleKind::kZbH1};

// F = 1, B = 2 (split evenly into its input and weight halves), no communication cost.
SimulationCosts unit_costs() { return SimulationCosts{}; }

SimulationResult run(ScheduleKind kind, ScheduleShape shape, SimulationCosts costs = unit_costs()) {
  return simulate(make_schedule(kind, shape), shape, costs);
}

TEST(PipelineSchedule, NamesRoundTrip) {
  const std::vector<std::string> expected{"gpipe", "1f1b", "interleaved_1f1b", "zb_h1"};
  EXPECT_EQ(choice_names<ScheduleKind>(), expected);
  for (ScheduleKind kind : kKinds) EXPECT_EQ(parse_choice<ScheduleKind>(choice_name(kind)), kind);
  EXPECT_FALSE(parse_choice<ScheduleKind>("zb_h2").has_value());
  EXPECT_FALSE(parse_choice<ScheduleKind>("GPipe").has_value()) << "names are exact";
  EXPECT_FALSE(parse_choice<ScheduleKind>("").has_value());
}

TEST(PipelineSchedule, RefusalsSayWhatWouldWork) {
  const std::string not_multiple = schedule_refusal(ScheduleKind::kInterleaved1f1b, {4, 6, 2});
  EXPECT_NE(not_multiple.find("multiple of the 4 stages"), std::string::npos) << not_multiple;
  EXPECT_NE(not_multiple.find("8 or 12"), std::string::npos) << not_multiple;
  EXPECT_NE(not_multiple.find("got 6"), std::string::npos) << not_multiple;
  const std::string one_chunk = schedule_refusal(ScheduleKind::kInterleaved1f1b, {4, 8, 1});
  EXPECT_NE(one_chunk.find("virtual_stages >= 2"), std::string::npos) << one_chunk;
  for (ScheduleKind kind : {ScheduleKind::kGpipe, ScheduleKind::k1f1b, ScheduleKind::kZbH1}) {
    const std::string chunks = schedule_refusal(kind, {4, 8, 2});
    EXPECT_NE(chunks.find("only for interleaved_1f1b"), std::string::npos) << chunks;
  }
  EXPECT_NE(schedule_refusal(ScheduleKind::k1f1b, {0, 8, 1}), "");
  EXPECT_NE(schedule_refusal(ScheduleKind::kGpipe, {2, 0, 1}), "");
  EXPECT_NE(schedule_refusal(ScheduleKind::kInterleaved1f1b, {2, 4, 0}), "");
  // Fewer micro-batches than stages is legal (a shorter warmup), only wasteful.
  EXPECT_EQ(schedule_refusal(ScheduleKind::k1f1b, {4, 2, 1}), "");
  EXPECT_EQ(schedule_refusal(ScheduleKind::kZbH1, {4, 2, 1}), "");
  EXPECT_EQ(schedule_refusal(ScheduleKind::kInterleaved1f1b, {4, 8, 2}), "");
  EXPECT_THROW(make_schedule(ScheduleKind::kInterleaved1f1b, {4, 6, 2}), std::invalid_argument);
}

TEST(PipelineSchedule, VirtualStagesFollowMegatronsLayout) {
  const ScheduleShape shape{4, 8, 3};
  EXPECT_EQ(virtual_stage(1, 0, shape), 1);
  EXPECT_EQ(virtual_stage(1, 2, shape), 9) << "chunk c of rank r is c * stages + r";
  for (int vs = 0; vs < 12; ++vs) {
    EXPECT_EQ(virtual_stage(rank_of_virtual_stage(vs, shape), chunk_of_virtual_stage(vs, shape), shape), vs);
    EXPECT_EQ(rank_of_virtual_stage(vs, shape), vs % 4);
  }
}

TEST(PipelineSchedule, EveryGeneratorIsValidAndDeadlockFreeOnAGrid) {
  int shapes = 0;
  for (ScheduleKind kind : kKinds)
    for (int p = 1; p <= 5; ++p)
      for (int m = 1; m <= 12; ++m)
        for (int v = 1; v <= 3; ++v) {
          const ScheduleShape shape{p, m, v};
          if (!schedule_refusal(kind, shape).empty()) continue;
          ++shapes;
          SCOPED_TRACE(std::string(choice_name(kind)) + " p=" + std::to_string(p) + " m=" + std::to_string(m) +
                       " v=" + std::to_string(v));
          const PipelineSchedule schedule = make_schedule(kind, shape);
          ASSERT_EQ(check_schedule(schedule, shape), "") << schedule_to_string(schedule, shape);
          const SimulationResult res = simulate(schedule, shape);
          ASSERT_FALSE(res.deadlock) << res.error << "\n" << schedule_to_string(schedule, shape);
          EXPECT_EQ(res.error, "");
          const size_t per_rank = static_cast<size_t>(m) * v * (kind == ScheduleKind::kZbH1 ? 3 : 2);
          for (const auto& list : schedule) EXPECT_EQ(list.size(), per_rank);
          EXPECT_GE(res.bubble, -1e-12);
        }
  // 3 one-chunk schedules x 60 shapes, plus interleaved's m % p == 0 shapes x 2 chunk counts.
  EXPECT_EQ(shapes, 3 * 60 + 2 * (12 + 6 + 4 + 3 + 2));
}

TEST(PipelineSchedule, GpipeAndOneFOneBOrders) {
  const ScheduleShape shape{3, 4, 1};
  const PipelineSchedule gpipe = make_schedule(ScheduleKind::kGpipe, shape);
  const std::vector<Action> all_f_then_all_b{{K::kForward, 0, 0},  {K::kForward, 1, 0},  {K::kForward, 2, 0},
                                             {K::kForward, 3, 0},  {K::kBackward, 0, 0}, {K::kBackward, 1, 0},
                                             {K::kBackward, 2, 0}, {K::kBackward, 3, 0}};
  for (const auto& list : gpipe) EXPECT_EQ(list, all_f_then_all_b);
  const PipelineSchedule one_f_one_b = make_schedule(ScheduleKind::k1f1b, shape);
  EXPECT_EQ(schedule_to_string(one_f_one_b, shape),
            "rank 0: F0 F1 F2 B0 F3 B1 B2 B3\n"
            "rank 1: F0 F1 B0 F2 B1 F3 B2 B3\n"
            "rank 2: F0 B0 F1 B1 F2 B2 F3 B3\n");
  // Fewer micro-batches than stages: the warmup is cut to what there is.
  const ScheduleShape short_shape{4, 2, 1};
  EXPECT_EQ(schedule_to_string(make_schedule(ScheduleKind::k1f1b, short_shape), short_shape),
            "rank 0: F0 F1 B0 B1\nrank 1: F0 F1 B0 B1\nrank 2: F0 F1 B0 B1\nrank 3: F0 B0 F1 B1\n");
}

TEST(PipelineSchedule, InterleavedFollowsMegatronsOrder) {
  // Warmup (p - r - 1) * 2 + (v - 1) * p: 4 forwards on rank 0, 2 on rank 1; forwards go through
  // chunks 0..v-1 per group of p micro-batches, backwards through v-1..0.
  const ScheduleShape shape{2, 4, 2};
  EXPECT_EQ(schedule_to_string(make_schedule(ScheduleKind::kInterleaved1f1b, shape), shape),
            "rank 0: F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0\n"
            "rank 1: F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0\n");
}

TEST(PipelineSchedule, ZbH1DelaysWeightHalvesByTheRank) {
  // Rank r runs 1f1b's order with split backwards and keeps its last r weight halves pending,
  // draining them at the end, where it would wait for the input gradients to reach rank 0.
  const ScheduleShape shape{3, 4, 1};
  EXPECT_EQ(schedule_to_string(make_schedule(ScheduleKind::kZbH1, shape), shape),
            "rank 0: F0 F1 F2 b0 w0 F3 b1 w1 b2 w2 b3 w3\n"
            "rank 1: F0 F1 b0 F2 b1 w0 F3 b2 w1 b3 w2 w3\n"
            "rank 2: F0 b0 F1 b1 F2 b2 w0 F3 b3 w1 w2 w3\n");
}

// The two ranks wait on each other: rank 0 wants micro-batch 0's gradient before sending
// micro-batch 1 forward, rank 1 wants micro-batch 1's forward before sending that gradient. Each
// list is valid on its own, so only the simulation can see it.
TEST(PipelineSchedule, CrossRankCycleIsADeadlock) {
  const ScheduleShape shape{2, 2, 1};
  const PipelineSchedule cycle{
      {{K::kForward, 0, 0}, {K::kBackward, 0, 0}, {K::kForward, 1, 0}, {K::kBackward, 1, 0}},
      {{K::kForward, 0, 0}, {K::kForward, 1, 0}, {K::kBackward, 0, 0}, {K::kBackward, 1, 0}}};
  EXPECT_EQ(check_schedule(cycle, shape), "");
  const SimulationResult res = simulate(cycle, shape);
  EXPECT_TRUE(res.deadlock);
  EXPECT_EQ(res.error,
            "rank 0 waits forever for input gradient (backward) of micro-batch 0, chunk 0 (for its backward of "
            "micro-batch 0, chunk 0): rank 1 has it as action 2 but is stuck at action 1 (forward of micro-batch 1, "
            "chunk 0)");
}

TEST(PipelineSchedule, BackwardBeforeItsForwardIsCaughtTwice) {
  const ScheduleShape shape{2, 2, 1};
  PipelineSchedule schedule = make_schedule(ScheduleKind::k1f1b, shape);
  std::swap(schedule[1][0], schedule[1][1]);  // the last rank: B0 F0 F1 B1
  EXPECT_EQ(check_schedule(schedule, shape),
            "rank 1, action 0 (backward of micro-batch 0, chunk 0): comes before its forward");
  const SimulationResult res = simulate(schedule, shape);
  EXPECT_TRUE(res.deadlock);
  EXPECT_NE(res.error.find("rank 0 waits forever"), std::string::npos) << res.error;
  EXPECT_NE(res.error.find("rank 1 has it as action"), std::string::npos) << res.error;
}

TEST(PipelineSchedule, CheckFindsMissingDuplicatedAndMisorderedActions) {
  const ScheduleShape shape{2, 3, 1};
  PipelineSchedule missing = make_schedule(ScheduleKind::k1f1b, shape);
  missing[1].pop_back();
  EXPECT_EQ(check_schedule(missing, shape), "rank 1 never runs the backward of micro-batch 2, chunk 0");
  EXPECT_TRUE(simulate(missing, shape).deadlock) << "rank 0 waits for that gradient";

  PipelineSchedule no_weight = make_schedule(ScheduleKind::kZbH1, shape);
  no_weight[0].pop_back();
  EXPECT_EQ(check_schedule(no_weight, shape), "rank 0 never runs the backward-weight of micro-batch 2, chunk 0");

  PipelineSchedule twice = make_schedule(ScheduleKind::k1f1b, shape);
  twice[0].insert(twice[0].begin(), Action{K::kForward, 0, 0});
  EXPECT_NE(check_schedule(twice, shape).find("a second forward"), std::string::npos);

  PipelineSchedule swapped = make_schedule(ScheduleKind::kZbH1, shape);  // rank 1 ends with w1 w2
  std::swap(swapped[1][swapped[1].size() - 1], swapped[1][swapped[1].size() - 2]);
  EXPECT_NE(check_schedule(swapped, shape).find("weight gradients out of micro-batch order"), std::string::npos)
      << check_schedule(swapped, shape);

  PipelineSchedule out_of_range = make_schedule(ScheduleKind::kGpipe, shape);
  out_of_range[0][0].chunk = 1;
  EXPECT_NE(check_schedule(out_of_range, shape).find("chunk out of range"), std::string::npos);
  const SimulationResult res = simulate(out_of_range, shape);
  EXPECT_FALSE(res.deadlock);
  EXPECT_NE(res.error.find("out of range"), std::string::npos);

  EXPECT_NE(check_schedule(make_schedule(ScheduleKind::k1f1b, {3, 3, 1}), shape), "") << "3 ranks for 2 stages";
}

TEST(PipelineSchedule, SimulatedBubblesMatchTheTheory) {
  const ScheduleShape flat{4, 8, 1}, chunked{4, 8, 2};
  const double gpipe = run(ScheduleKind::kGpipe, flat).bubble;
  const double one_f_one_b = run(ScheduleKind::k1f1b, flat).bubble;
  const double interleaved = run(ScheduleKind::kInterleaved1f1b, chunked).bubble;
  const double zb_h1 = run(ScheduleKind::kZbH1, flat).bubble;
  std::printf("p=4 m=8, F=1 B_input=1 B_weight=1: bubble gpipe %.4f, 1f1b %.4f, interleaved_1f1b (v=2) %.4f, "
              "zb_h1 %.4f (zb_h1 / 1f1b = %.3f)\n",
              gpipe, one_f_one_b, interleaved, zb_h1, zb_h1 / one_f_one_b);
  EXPECT_NEAR(gpipe, 3.0 / 11, 1e-9);
  EXPECT_NEAR(one_f_one_b, 3.0 / 11, 1e-9);
  EXPECT_NEAR(interleaved, 3.0 / 19, 1e-9) << "(p-1)/(v*m+p-1)";
  EXPECT_NEAR(zb_h1, 3.0 / 27, 1e-9) << "(p-1)/(3m+p-1)";
  EXPECT_LT(zb_h1, 0.5 * one_f_one_b);
  // Exact everywhere the theory is meant for: zb_h1 needs m >= p to reach its steady state.
  for (ScheduleKind kind : kKinds)
    for (int p = 1; p <= 5; ++p)
      for (int m = 1; m <= 12; ++m)
        for (int v = 1; v <= 3; ++v) {
          const ScheduleShape shape{p, m, v};
          if (!schedule_refusal(kind, shape).empty() || (kind == ScheduleKind::kZbH1 && m < p)) continue;
          EXPECT_NEAR(run(kind, shape).bubble, theoretical_bubble(kind, shape), 1e-9)
              << choice_name(kind) << " p=" << p << " m=" << m << " v=" << v;
        }
}

TEST(PipelineSchedule, ZbH1StaysAheadOfOneFOneBWithUnevenCosts) {
  // B_input cheaper than B_weight, communication not free: the split still pays.
  const SimulationCosts costs{1.0, 0.8, 1.2, 0.05, {}};
  for (int m : {4, 8, 16}) {
    const ScheduleShape shape{4, m, 1};
    const double zb = run(ScheduleKind::kZbH1, shape, costs).bubble;
    const double base = run(ScheduleKind::k1f1b, shape, costs).bubble;
    std::printf("p=4 m=%d, F=1 Bi=0.8 Bw=1.2 p2p=0.05: 1f1b %.4f, zb_h1 %.4f\n", m, base, zb);
    EXPECT_LT(zb, 0.6 * base) << "m=" << m;
  }
}

TEST(PipelineSchedule, PeakActivationsInFlight) {
  for (int p = 1; p <= 5; ++p)
    for (int m = 1; m <= 12; ++m) {
      const ScheduleShape shape{p, m, 1};
      SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
      EXPECT_EQ(run(ScheduleKind::kGpipe, shape).peak_in_flight, std::vector<int>(p, m));
      const SimulationResult one_f_one_b = run(ScheduleKind::k1f1b, shape);
      for (int r = 0; r < p; ++r) EXPECT_EQ(one_f_one_b.peak_in_flight[r], std::min(p - r, m)) << "rank " << r;
      // zb_h1: rank r holds its 1f1b share plus its r pending weight halves, min(p, m) on every
      // rank: 1f1b's rank-0 peak, so the pipeline's peak memory is 1f1b's.
      EXPECT_EQ(run(ScheduleKind::kZbH1, shape).peak_in_flight, std::vector<int>(p, std::min(p, m)));
    }
  // Interleaved counts micro-batch-chunks (each 1/v of a rank's layers): rank r holds its warmup
  // (p - r - 1) * 2 + (v - 1) * p plus one, capped at m * v.
  const SimulationResult interleaved = run(ScheduleKind::kInterleaved1f1b, {4, 8, 2});
  std::printf("interleaved_1f1b p=4 m=8 v=2 peak micro-batch-chunks per rank: %d %d %d %d (1f1b: 4 3 2 1 "
              "micro-batches)\n",
              interleaved.peak_in_flight[0], interleaved.peak_in_flight[1], interleaved.peak_in_flight[2],
              interleaved.peak_in_flight[3]);
  EXPECT_EQ(interleaved.peak_in_flight, (std::vector<int>{11, 9, 7, 5}));
  EXPECT_EQ(run(ScheduleKind::kInterleaved1f1b, {4, 4, 2}).peak_in_flight, (std::vector<int>{8, 8, 7, 5}));
}

TEST(PipelineSchedule, CommunicationAndUnevenStagesDelayTheNeighbour) {
  const ScheduleShape shape{2, 1, 1};
  const PipelineSchedule schedule = make_schedule(ScheduleKind::k1f1b, shape);
  // Rank 0: F [0, 1]; rank 1: F [1.5, 2.5], B [2.5, 4.5]; rank 0: B [5, 7].
  const SimulationResult p2p = simulate(schedule, shape, {1, 1, 1, 0.5, {}});
  EXPECT_EQ(p2p.start, (std::vector<std::vector<double>>{{0, 5}, {1.5, 2.5}}));
  EXPECT_DOUBLE_EQ(p2p.makespan, 7);
  EXPECT_EQ(p2p.busy, (std::vector<double>{3, 3}));
  EXPECT_DOUBLE_EQ(p2p.bubble, 1 - 6.0 / 14);
  // Rank 1 twice as slow: F [1, 3], B [3, 7]; rank 0's B [7, 9].
  const SimulationResult slow = simulate(schedule, shape, {1, 1, 1, 0, {1, 2}});
  EXPECT_EQ(slow.start, (std::vector<std::vector<double>>{{0, 7}, {1, 3}}));
  EXPECT_DOUBLE_EQ(slow.makespan, 9);
  EXPECT_EQ(slow.busy, (std::vector<double>{3, 6}));
}

TEST(PipelineSchedule, DescribeNamesTheAction) {
  EXPECT_EQ(describe({K::kBackwardWeight, 3, 1}), "backward-weight of micro-batch 3, chunk 1");
  EXPECT_EQ(describe({K::kForward, 0, 0}), "forward of micro-batch 0, chunk 0");
}

}  // namespace
}  // namespace ht

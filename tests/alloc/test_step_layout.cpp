#include "alloc/step_layout.h"

#include "alloc/cpu_arena.h"
#include "alloc/cpu_device_allocator.h"
#include "alloc/static_layout.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

namespace ht {
namespace {

constexpr int64_t kStepAlign = static_cast<int64_t>(CpuArena::kAlignment);
constexpr int64_t kStepUnit = 64 * 1024;  // the unit of the arena tests

struct AdvisorInstalled {
  explicit AdvisorInstalled(PlacementAdvisor* advisor) { set_placement_advisor(advisor); }
  ~AdvisorInstalled() { set_placement_advisor(nullptr); }
};

TEST(StepLayout, IdleItGivesNoAdviceAndCountsNothing) {
  StepLayout layout;
  EXPECT_FALSE(layout.offset_for(kStepAlign).has_value());
  layout.on_allocated(0, kStepAlign, false);
  layout.on_freed(0);
  EXPECT_EQ(layout.hits(), 0);
  EXPECT_EQ(layout.misses(), 0);
  EXPECT_FALSE(layout.has_plan());
  EXPECT_THROW(layout.begin_replay(), std::logic_error) << "nothing recorded";
  EXPECT_THROW(layout.end_recording(), std::logic_error);
  EXPECT_THROW(layout.end_replay(), std::logic_error);
  layout.begin_recording({}, 1024 * kStepAlign);
  EXPECT_THROW(layout.begin_replay(), std::logic_error) << "still recording";
  EXPECT_FALSE(layout.offset_for(kStepAlign).has_value()) << "recording gives no advice";
  layout.end_recording();
  EXPECT_TRUE(layout.has_plan());
  EXPECT_EQ(layout.planned_peak_bytes(), 0);
}

// The advisor alone, fed by hand: lifetimes on the event clock, obstacles, and replay's matching.
TEST(StepLayout, RecordsLifetimesAndServesThePlanInOrder) {
  StepLayout layout;
  // An obstacle at [8, 10) units freed during the step, one at [60, 64) for ever.
  layout.begin_recording({{8 * kStepAlign, 2 * kStepAlign}, {60 * kStepAlign, 4 * kStepAlign}}, 64 * kStepAlign);
  layout.on_allocated(0, 4 * kStepAlign, false);       // block 0, tick 0
  layout.on_allocated(4 * kStepAlign, 2 * kStepAlign, false);  // block 1, tick 1
  layout.on_freed(8 * kStepAlign);                     // obstacle 0, tick 2
  layout.on_freed(0);                          // block 0, tick 3
  layout.on_allocated(0, kStepAlign, false);           // block 2, tick 4, never freed
  layout.on_freed(4 * kStepAlign);                     // block 1, tick 5
  layout.on_freed(12345 * kStepAlign);                 // not a block: ignored
  layout.end_recording();
  const std::vector<StepLayout::Block> blocks = layout.blocks();
  ASSERT_EQ(blocks.size(), 3U);
  EXPECT_EQ(std::make_pair(blocks[0].begin, blocks[0].end), std::make_pair(int64_t{0}, int64_t{3}));
  EXPECT_EQ(std::make_pair(blocks[1].begin, blocks[1].end), std::make_pair(int64_t{1}, int64_t{5}));
  EXPECT_EQ(std::make_pair(blocks[2].begin, blocks[2].end), std::make_pair(int64_t{4}, int64_t{6}));
  const std::vector<PlacedBlock> obstacles = layout.obstacles();
  ASSERT_EQ(obstacles.size(), 2U);
  EXPECT_EQ(obstacles[0].block.end, 2);
  EXPECT_EQ(obstacles[1].block.end, 6);
  EXPECT_EQ(layout.lower_bound_bytes(), 6 * kStepAlign);
  EXPECT_EQ(layout.planned_peak_bytes(), 6 * kStepAlign);
  EXPECT_TRUE(layout.plan_fits());
  std::vector<LayoutBlock> all;
  std::vector<int64_t> offsets;
  for (const auto& b : blocks) {
    all.push_back({b.bytes, b.begin, b.end});
    offsets.push_back(b.offset);
  }
  for (const auto& o : obstacles) {
    all.push_back(o.block);
    offsets.push_back(o.offset);
  }
  EXPECT_FALSE(find_overlap(all, offsets).has_value());

  layout.begin_replay();
  EXPECT_EQ(layout.offset_for(2 * kStepAlign), blocks[1].offset) << "the second first: worker threads reorder";
  EXPECT_EQ(layout.offset_for(4 * kStepAlign), blocks[0].offset);
  EXPECT_FALSE(layout.offset_for(3 * kStepAlign).has_value()) << "no block of that size is expected";
  EXPECT_EQ(layout.offset_for(kStepAlign), blocks[2].offset);
  EXPECT_FALSE(layout.offset_for(kStepAlign).has_value()) << "each block is served once";
  for (int i = 0; i < 3; ++i) layout.on_allocated(blocks[i].offset, blocks[i].bytes, true);
  layout.on_allocated(40 * kStepAlign, 3 * kStepAlign, false);
  layout.end_replay();
  EXPECT_EQ(layout.hits(), 3);
  EXPECT_EQ(layout.misses(), 1);
  EXPECT_FALSE(layout.replay_matched());
}

TEST(StepLayout, AReplayThatDivergedGivesUpTheBlockItPassedAndGoesOn) {
  StepLayout layout;
  layout.begin_recording({}, 1 << 20);
  layout.on_allocated(0, 2 * kStepAlign, false);
  for (int64_t i = 1; i < 40; ++i) layout.on_allocated(i * 2 * kStepAlign, kStepAlign, false);
  layout.end_recording();
  layout.begin_replay();
  EXPECT_FALSE(layout.offset_for(3 * kStepAlign).has_value());  // where the 2-unit block was
  for (int i = 1; i < 40; ++i) {
    ASSERT_TRUE(layout.offset_for(kStepAlign).has_value()) << i;
    if (i == 20) {
      EXPECT_FALSE(layout.offset_for(5 * kStepAlign).has_value()) << "an extra allocation";
    }
  }
  EXPECT_FALSE(layout.offset_for(2 * kStepAlign).has_value()) << "given up after 16 later ones were served";
  layout.end_replay();
}

// Watches the arena during a step: the smallest largest-free-block and the highest in_use.
class FragmentationProbe final : public AllocationObserver {
 public:
  explicit FragmentationProbe(const CpuArena& arena) : arena_(arena) { set_allocation_observer(this); }
  ~FragmentationProbe() override { set_allocation_observer(nullptr); }
  void on_allocated(const void*, int64_t) override {
    const ArenaStats s = arena_.stats();
    min_largest_free = std::min(min_largest_free, s.largest_free_block);
    max_in_use = std::max(max_in_use, s.in_use);
  }
  void on_freed(const void*, int64_t) override {}
  void reset() {
    min_largest_free = std::numeric_limits<int64_t>::max();
    max_in_use = 0;
  }
  int64_t min_largest_free = std::numeric_limits<int64_t>::max();
  int64_t max_in_use = 0;

 private:
  const CpuArena& arena_;
};

// What the plan predicts for the probe: after each allocation, the largest gap between the
// planned blocks and obstacles then live.
int64_t planned_min_largest_free(const StepLayout& layout, int64_t capacity) {
  const auto blocks = layout.blocks();
  const auto obstacles = layout.obstacles();
  int64_t result = std::numeric_limits<int64_t>::max();
  for (const auto& now : blocks) {
    const int64_t t = now.begin;
    std::vector<std::pair<int64_t, int64_t>> used;
    for (const auto& b : blocks) {
      if (b.begin <= t && t < b.end) used.emplace_back(b.offset, b.offset + b.bytes);
    }
    for (const auto& o : obstacles) {
      if (o.block.begin <= t && t < o.block.end) used.emplace_back(o.offset, o.offset + o.block.bytes);
    }
    std::sort(used.begin(), used.end());
    int64_t cursor = 0, largest = 0;
    for (const auto& [start, end] : used) {
      largest = std::max(largest, start - cursor);
      cursor = std::max(cursor, end);
    }
    result = std::min(result, std::max(largest, capacity - cursor));
  }
  return result;
}

at::Tensor filled(int64_t bytes, uint8_t value) {
  at::Tensor t = at::empty({bytes}, at::kByte);
  std::memset(t.data_ptr(), value, static_cast<size_t>(bytes));
  return t;
}

// Checks that nothing else wrote over t, then frees it.
void check_and_free(at::Tensor& t, uint8_t value) {
  const uint8_t* p = t.data_ptr<uint8_t>();
  EXPECT_TRUE(std::all_of(p, p + t.numel(), [value](uint8_t v) { return v == value; })) << int(value);
  t.reset();
}

// A step that fragments memory under the arena's online rule: four 2-unit blocks, a and c die,
// and a 4-unit block cannot use their two separate holes. The arguments make replays that
// diverge.
void fragmenting_step(int64_t a_units = 2, int64_t e_units = 4, bool extra = false) {
  at::Tensor a = filled(a_units * kStepUnit, 1), b = filled(2 * kStepUnit, 2), c = filled(2 * kStepUnit, 3), d = filled(2 * kStepUnit, 4);
  at::Tensor t1 = filled(kStepUnit, 5);
  check_and_free(t1, 5);
  at::Tensor x = extra ? filled(5 * kStepUnit + 100, 9) : at::Tensor();
  check_and_free(a, 1);
  check_and_free(c, 3);
  at::Tensor e = filled(e_units * kStepUnit, 6), t2 = filled(kStepUnit, 7);
  check_and_free(t2, 7);
  if (extra) check_and_free(x, 9);
  check_and_free(b, 2);
  check_and_free(d, 4);
  check_and_free(e, 6);
}

class StepLayoutInArena : public ::testing::Test {
 protected:
  static constexpr int64_t kCapacity = 48 * kStepUnit;
  void SetUp() override {
    // Sixteen units from the top, every other one freed again: eight pinned units (the
    // "parameters") with one-unit holes between them, above 33 free units.
    std::vector<at::Tensor> units;
    for (int i = 0; i < 16; ++i) units.push_back(filled(kStepUnit, 100));
    for (int i = 0; i < 16; ++i) {
      if (i % 2 == 0) pins_.push_back(units[static_cast<size_t>(i)]);
    }
  }
  std::shared_ptr<CpuArena> arena_ = std::make_shared<CpuArena>(kCapacity);
  ArenaScope scope_{arena_};
  std::vector<at::Tensor> pins_;
};

TEST_F(StepLayoutInArena, AReplayedStepIsThePlanEveryTimeAndFragmentsLessThanTheOnlineRule) {
  ASSERT_EQ(arena_->stats().largest_free_block, 33 * kStepUnit);
  StepLayout layout;
  AdvisorInstalled installed(&layout);
  FragmentationProbe probe(*arena_);
  layout.begin_recording(*arena_);
  fragmenting_step();
  layout.end_recording();
  const int64_t online_min_free = probe.min_largest_free;
  const int64_t recorded_in_use = probe.max_in_use;
  EXPECT_EQ(online_min_free, 21 * kStepUnit) << "the 4-unit block went below the four";
  EXPECT_EQ(layout.blocks().size(), 7U);
  EXPECT_EQ(layout.obstacles().size(), 8U);
  EXPECT_EQ(layout.lower_bound_bytes(), 9 * kStepUnit);
  EXPECT_EQ(layout.planned_peak_bytes(), 9 * kStepUnit) << "the plan reaches the bound here";
  EXPECT_TRUE(layout.plan_fits());
  const int64_t planned_min_free = planned_min_largest_free(layout, kCapacity);
  EXPECT_EQ(planned_min_free, 24 * kStepUnit);

  const int64_t failed_before = arena_->stats().failed_allocations;
  for (int step = 0; step < 3; ++step) {
    probe.reset();
    layout.begin_replay();
    fragmenting_step();
    layout.end_replay();
    EXPECT_TRUE(layout.replay_matched()) << "step " << step;
    EXPECT_EQ(layout.hits(), 7);
    EXPECT_EQ(layout.misses(), 0);
    EXPECT_EQ(probe.min_largest_free, planned_min_free) << "the arena is the plan at every allocation";
    EXPECT_EQ(probe.max_in_use, recorded_in_use) << "the same bytes, placed differently";
  }
  EXPECT_EQ(arena_->stats().failed_allocations, failed_before) << "no advice was refused";
  EXPECT_EQ(arena_->stats().in_use, 8 * kStepUnit);
}

TEST_F(StepLayoutInArena, ADivergingReplayMissesAndStillAllocatesCorrectly) {
  StepLayout layout;
  AdvisorInstalled installed(&layout);
  layout.begin_recording(*arena_);
  fragmenting_step();
  layout.end_recording();

  // Another size for e, and an extra block: those two miss, the rest is served as planned.
  // Every block's bytes are checked before it is freed, so an overlap would show.
  layout.begin_replay();
  fragmenting_step(/*a_units=*/2, /*e_units=*/3, /*extra=*/true);
  layout.end_replay();
  EXPECT_FALSE(layout.replay_matched());
  EXPECT_EQ(layout.misses(), 2);
  EXPECT_EQ(layout.hits(), 6);
  EXPECT_EQ(arena_->stats().in_use, 8 * kStepUnit) << "every block went back";

  // Another size for the first block: b takes a's planned block (same size, next in the
  // window), and the shift costs more misses; still every block is correct.
  layout.begin_replay();
  fragmenting_step(/*a_units=*/3);
  layout.end_replay();
  EXPECT_FALSE(layout.replay_matched());
  EXPECT_GE(layout.misses(), 2);
  EXPECT_EQ(layout.hits() + layout.misses(), 7);
  EXPECT_EQ(arena_->stats().in_use, 8 * kStepUnit);

  layout.begin_replay();  // the step as recorded again: the plan still holds
  fragmenting_step();
  layout.end_replay();
  EXPECT_TRUE(layout.replay_matched());
}

// ATen kernels on the parameters, as a step does: outputs and temporaries are the step's
// blocks. It returns a number, not a tensor: a result kept past the step would hold an address
// the next step's plan expects free.
double kernel_step(const at::Tensor& w, const at::Tensor& x) {
  at::Tensor h = at::relu(at::mm(x, w));
  at::Tensor y = at::tanh(h * 2 + 1);
  at::Tensor g = at::mm(y.t(), x).t();  // the shape of w
  return (g.sum() + y.mean()).item<double>();
}

TEST_F(StepLayoutInArena, KernelsReplayAtThePlannedOffsetsAndComputeTheSame) {
  at::manual_seed(0);
  const at::Tensor w = at::randn({64, 64});
  const at::Tensor x = at::randn({128, 64});
  StepLayout layout;
  AdvisorInstalled installed(&layout);
  layout.begin_recording(*arena_);
  const double recorded = kernel_step(w, x);
  layout.end_recording();
  EXPECT_GE(layout.blocks().size(), 6U);
  for (int step = 0; step < 3; ++step) {
    layout.begin_replay();
    const double replayed = kernel_step(w, x);
    layout.end_replay();
    EXPECT_TRUE(layout.replay_matched()) << "hits " << layout.hits() << " misses " << layout.misses();
    EXPECT_EQ(replayed, recorded);
  }
}

// Threads allocating at once against one plan: whatever they are served, each block is theirs.
TEST_F(StepLayoutInArena, ConcurrentAllocationsDuringAReplayStayCorrect) {
  StepLayout layout;
  AdvisorInstalled installed(&layout);
  const auto work = [](uint8_t id) {
    for (int i = 0; i < 20; ++i) {
      at::Tensor a = filled((1 + i % 3) * kStepAlign * 8, id);
      at::Tensor b = filled(kStepAlign * 8, static_cast<uint8_t>(id + 100));
      check_and_free(a, id);
      check_and_free(b, static_cast<uint8_t>(id + 100));
    }
  };
  const auto run_threads = [&] {
    std::vector<std::thread> threads;
    for (uint8_t id = 1; id <= 4; ++id) threads.emplace_back(work, id);
    for (std::thread& t : threads) t.join();
  };
  layout.begin_recording(*arena_);
  run_threads();
  layout.end_recording();
  ASSERT_EQ(layout.blocks().size(), 160U);
  layout.begin_replay();
  run_threads();
  layout.end_replay();
  EXPECT_EQ(layout.hits() + layout.misses(), 160);
  EXPECT_EQ(arena_->stats().in_use, 8 * kStepUnit);
}

}  // namespace
}  // namespace ht

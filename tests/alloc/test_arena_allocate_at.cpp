// CpuArena::allocate_at, and the allocator's PlacementAdvisor hook that uses it.
#include "alloc/cpu_arena.h"
#include "alloc/cpu_device_allocator.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <random>
#include <utility>
#include <vector>

namespace ht {
namespace {

constexpr int64_t kAlign = static_cast<int64_t>(CpuArena::kAlignment);

using Blocks = std::vector<std::pair<int64_t, int64_t>>;

TEST(CpuArenaAllocateAt, CarvesExactlyTheRangeAndSplitsTheHole) {
  CpuArena arena(16 * kAlign);
  void* base = arena.allocate_at(0, kAlign);
  ASSERT_NE(base, nullptr);
  arena.deallocate(base);

  void* mid = arena.allocate_at(4 * kAlign, 3 * kAlign);  // two remainders: [0, 4) and [7, 16)
  ASSERT_EQ(mid, static_cast<char*>(base) + 4 * kAlign);
  EXPECT_EQ(arena.offset_of_block(mid), 4 * kAlign);
  EXPECT_EQ(arena.block_bytes(mid), 3 * kAlign);
  ArenaStats s = arena.stats();
  EXPECT_EQ(s.in_use, 3 * kAlign);
  EXPECT_EQ(s.peak_in_use, 3 * kAlign);
  EXPECT_EQ(s.free_blocks, 2);
  EXPECT_EQ(s.largest_free_block, 9 * kAlign);
  EXPECT_EQ(s.blocks_in_use, 1);
  EXPECT_EQ(s.allocations, 2);  // the probe at 0 counted too
  EXPECT_EQ(arena.adjacent_free_bytes(mid), 13 * kAlign);

  void* low = arena.allocate_at(0, 4 * kAlign);        // the whole low remainder: no split
  void* high = arena.allocate_at(12 * kAlign, 4 * kAlign);  // the top of [7, 16): one remainder
  void* one = arena.allocate_at(7 * kAlign, 1);         // rounded like allocate()
  ASSERT_NE(low, nullptr);
  ASSERT_NE(high, nullptr);
  ASSERT_NE(one, nullptr);
  EXPECT_EQ(arena.block_bytes(one), kAlign);
  EXPECT_EQ(arena.allocated_blocks(), (Blocks{{0, 4 * kAlign}, {4 * kAlign, 3 * kAlign}, {7 * kAlign, kAlign}, {12 * kAlign, 4 * kAlign}}));
  s = arena.stats();
  EXPECT_EQ(s.free_blocks, 1);  // [8, 12)
  EXPECT_EQ(s.largest_free_block, 4 * kAlign);
  EXPECT_EQ(s.in_use, 12 * kAlign);
  // allocate() sees the same free maps.
  EXPECT_EQ(arena.allocate(4 * kAlign, CpuArena::End::kLow), static_cast<char*>(base) + 8 * kAlign);
  EXPECT_EQ(arena.allocate(1), nullptr);
  for (void* p : {low, high, one, mid, static_cast<void*>(static_cast<char*>(base) + 8 * kAlign)}) arena.deallocate(p);
  s = arena.stats();
  EXPECT_EQ(s.free_blocks, 1) << "every split merges back";
  EXPECT_EQ(s.largest_free_block, s.capacity);
  EXPECT_EQ(s.in_use, 0);
  EXPECT_EQ(s.peak_in_use, 16 * kAlign);
}

TEST(CpuArenaAllocateAt, RefusesRangesThatAreNotEntirelyFreeOrInside) {
  CpuArena arena(16 * kAlign);
  void* a = arena.allocate_at(4 * kAlign, 4 * kAlign);  // [4, 8)
  ASSERT_NE(a, nullptr);
  const ArenaStats before = arena.stats();
  const std::vector<std::pair<int64_t, size_t>> refused = {
      {4 * kAlign, kAlign},               // the block's start
      {5 * kAlign, kAlign},               // inside it
      {2 * kAlign, 3 * kAlign},           // a free start running into it
      {7 * kAlign, 2 * kAlign},           // its last unit and the free one after
      {kAlign / 2, 1},                // not aligned
      {-kAlign, kAlign},                  // before the arena
      {16 * kAlign, kAlign},              // at its end
      {14 * kAlign, 3 * kAlign},          // past its end
      {0, SIZE_MAX},              // must not overflow while rounding
      {INT64_MAX / kAlign * kAlign, kAlign},  // nor while adding
  };
  for (const auto& [offset, bytes] : refused) {
    EXPECT_EQ(arena.allocate_at(offset, bytes), nullptr) << offset << " + " << bytes;
  }
  const ArenaStats after = arena.stats();
  EXPECT_EQ(after.failed_allocations, before.failed_allocations + static_cast<int64_t>(refused.size()));
  EXPECT_EQ(after.allocations, before.allocations);
  EXPECT_EQ(after.in_use, before.in_use);
  EXPECT_EQ(after.free_blocks, before.free_blocks);
  EXPECT_EQ(arena.allocated_blocks(), (Blocks{{4 * kAlign, 4 * kAlign}}));
  EXPECT_EQ(arena.offset_of_block(static_cast<char*>(a) + kAlign), -1) << "an interior pointer starts no block";
  arena.deallocate(a);
}

// Random allocate_at against a map of which units are taken: it succeeds exactly when the
// whole range is free and inside, and the arena's books agree after every step.
TEST(CpuArenaAllocateAt, RandomizedAgainstAUnitMap) {
  constexpr int kUnits = 64;
  CpuArena arena(kUnits * kAlign);
  std::vector<int> owner(kUnits, -1);
  std::vector<std::pair<void*, int64_t>> live;  // pointer, units
  std::mt19937 rng(7);
  for (int step = 0; step < 4000; ++step) {
    if (live.empty() || rng() % 100 < 60) {
      const int64_t unit = static_cast<int64_t>(rng() % (kUnits + 4)) - 2;
      const int64_t units = 1 + static_cast<int64_t>(rng() % 8);
      bool free = unit >= 0 && unit + units <= kUnits;
      for (int64_t u = unit; free && u < unit + units; ++u) free = owner[static_cast<size_t>(u)] < 0;
      void* p = arena.allocate_at(unit * kAlign, static_cast<size_t>(units * kAlign - (rng() % kAlign)));
      ASSERT_EQ(p != nullptr, free) << "step " << step << " unit " << unit << " units " << units;
      if (p == nullptr) continue;
      for (int64_t u = unit; u < unit + units; ++u) owner[static_cast<size_t>(u)] = step;
      live.emplace_back(p, units);
    } else {
      const size_t k = rng() % live.size();
      const int64_t unit = arena.offset_of_block(live[k].first) / kAlign;
      for (int64_t u = unit; u < unit + live[k].second; ++u) owner[static_cast<size_t>(u)] = -1;
      arena.deallocate(live[k].first);
      live[k] = live.back();
      live.pop_back();
    }
    // The arena's free space is exactly the map's: count the free units and runs.
    int64_t free_units = 0, runs = 0, longest = 0, run = 0;
    for (int u = 0; u < kUnits; ++u) {
      run = owner[static_cast<size_t>(u)] < 0 ? run + 1 : 0;
      free_units += run > 0;
      runs += run == 1;
      longest = std::max(longest, run);
    }
    const ArenaStats s = arena.stats();
    ASSERT_EQ(s.free_bytes, free_units * kAlign);
    ASSERT_EQ(s.free_blocks, runs);
    ASSERT_EQ(s.largest_free_block, longest * kAlign);
    ASSERT_EQ(s.blocks_in_use, static_cast<int64_t>(live.size()));
  }
  for (const auto& block : live) arena.deallocate(block.first);
  EXPECT_EQ(arena.stats().free_blocks, 1);
}

// Says what it is told to and remembers what it hears.
class ScriptedAdvisor final : public PlacementAdvisor {
 public:
  struct Event {
    char kind;  // 'a' allocated, 'f' freed
    int64_t offset;
    int64_t bytes;
    bool as_advised;
    bool operator==(const Event& o) const {
      return kind == o.kind && offset == o.offset && bytes == o.bytes && as_advised == o.as_advised;
    }
  };
  std::optional<int64_t> advice;
  std::vector<int64_t> asked;  // rounded sizes
  std::vector<Event> events;

  std::optional<int64_t> offset_for(int64_t rounded_bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    asked.push_back(rounded_bytes);
    return advice;
  }
  void on_allocated(int64_t offset, int64_t rounded_bytes, bool as_advised) override {
    std::lock_guard<std::mutex> lock(mu_);
    events.push_back({'a', offset, rounded_bytes, as_advised});
  }
  void on_freed(int64_t offset) override {
    std::lock_guard<std::mutex> lock(mu_);
    events.push_back({'f', offset, 0, false});
  }

 private:
  std::mutex mu_;
};

class CountingObserver final : public AllocationObserver {
 public:
  void on_allocated(const void*, int64_t) override { ++allocated; }
  void on_freed(const void*, int64_t) override { ++freed; }
  int allocated = 0;
  int freed = 0;
};

struct AdvisorInstalled {
  explicit AdvisorInstalled(PlacementAdvisor* advisor) { set_placement_advisor(advisor); }
  ~AdvisorInstalled() { set_placement_advisor(nullptr); }
};

using Event = ScriptedAdvisor::Event;

TEST(PlacementAdvisor, TheAllocatorTakesAdviceWhereTheRangeIsFreeAndReportsEveryBlock) {
  auto arena = std::make_shared<CpuArena>(64 * kAlign);
  ScriptedAdvisor advisor;
  CountingObserver observer;
  set_allocation_observer(&observer);
  int64_t b_offset = -1, c_offset = -1, d_offset = -1;
  {
    ArenaScope scope(arena);
    AdvisorInstalled installed(&advisor);
    advisor.advice = 8 * kAlign;
    at::Tensor a = at::full({100}, 7, at::kByte);  // 100 bytes: two units
    EXPECT_EQ(arena->offset_of_block(a.data_ptr()), 8 * kAlign);
    at::Tensor b = at::empty({3 * kAlign - 5}, at::kByte);  // the same advice, now taken
    b_offset = arena->offset_of_block(b.data_ptr());
    EXPECT_EQ(b_offset, 61 * kAlign) << "as without advice: from the top";
    advisor.advice = 64 * kAlign;  // out of range
    at::Tensor c = at::empty({kAlign}, at::kByte);
    c_offset = arena->offset_of_block(c.data_ptr());
    advisor.advice.reset();
    at::Tensor d = at::empty({kAlign}, at::kByte);
    d_offset = arena->offset_of_block(d.data_ptr());
    {
      HostAllocationScope host;  // not the arena's: the advisor is not asked
      at::Tensor h = at::empty({kAlign}, at::kByte);
    }
    EXPECT_EQ(advisor.asked, (std::vector<int64_t>{2 * kAlign, 3 * kAlign, kAlign, kAlign}));
    b.reset();
    const uint8_t* bytes = a.data_ptr<uint8_t>();
    EXPECT_TRUE(std::all_of(bytes, bytes + 100, [](uint8_t v) { return v == 7; })) << "the block is usable";
    a.reset();
  }  // d and c are freed here, before the advisor is unset
  set_allocation_observer(nullptr);
  const std::vector<Event> expected = {{'a', 8 * kAlign, 2 * kAlign, true}, {'a', b_offset, 3 * kAlign, false},
                                       {'a', c_offset, kAlign, false},  {'a', d_offset, kAlign, false},
                                       {'f', b_offset, 0, false},   {'f', 8 * kAlign, 0, false},
                                       {'f', d_offset, 0, false},   {'f', c_offset, 0, false}};
  EXPECT_EQ(advisor.events, expected);
  EXPECT_EQ(observer.allocated, 4) << "the observer still sees every arena block";
  EXPECT_EQ(observer.freed, 4);
}

// Frees the tensor it holds when asked for room.
class OneEviction final : public OutOfMemoryHandler {
 public:
  at::Tensor victim;
  bool make_room(size_t) override {
    if (!victim.defined()) return false;
    victim.reset();
    return true;
  }
};

TEST(PlacementAdvisor, AFailedAdviceStillMakesRoomAsBefore) {
  auto arena = std::make_shared<CpuArena>(8 * kAlign);
  ScriptedAdvisor advisor;
  OneEviction handler;
  ArenaScope scope(arena);
  AdvisorInstalled installed(&advisor);
  set_out_of_memory_handler(&handler);
  handler.victim = at::empty({4 * kAlign}, at::kByte);  // [4, 8), from the top
  at::Tensor low = at::empty({2 * kAlign}, at::kByte);  // [2, 4)
  advisor.advice = 4 * kAlign;                           // taken by the victim
  at::Tensor big = at::empty({4 * kAlign}, at::kByte);   // fits only after the eviction
  set_out_of_memory_handler(nullptr);
  EXPECT_FALSE(handler.victim.defined());
  EXPECT_EQ(arena->offset_of_block(big.data_ptr()), 4 * kAlign);
  const std::vector<Event> tail(advisor.events.end() - 2, advisor.events.end());
  EXPECT_EQ(tail, (std::vector<Event>{{'f', 4 * kAlign, 0, false}, {'a', 4 * kAlign, 4 * kAlign, false}}))
      << "the eviction's free comes first, and the block is not counted as advised";
  advisor.advice = 0;  // free: taken even though the usual rule would use the top
  low.reset();
  at::Tensor small = at::empty({kAlign}, at::kByte);
  EXPECT_EQ(arena->offset_of_block(small.data_ptr()), 0);
  big.reset();
  small.reset();
  EXPECT_EQ(arena->stats().in_use, 0);
}

}  // namespace
}  // namespace ht

#include "alloc/deferred_frees.h"

#include "alloc/cpu_arena.h"
#include "alloc/cpu_device_allocator.h"
#include "alloc/out_of_memory.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

namespace ht {
namespace {

// A stream position that is reached when the test says, or when the host waits for it.
class TestFence final : public Fence {
 public:
  bool passed() override { return reached; }
  void wait() override {
    ++waits;
    reached = true;
  }
  bool reached = false;
  int waits = 0;
};

TEST(DeferredFrees, GivesABlockBackOnlyOnceItsFenceHasPassed) {
  DeferredFrees frees;
  auto first = std::make_shared<TestFence>(), second = std::make_shared<TestFence>();
  std::vector<int> released;
  frees.defer(first, [&] { released.push_back(1); });
  frees.defer(second, [&] { released.push_back(2); });
  EXPECT_EQ(frees.pending(), 2u);
  EXPECT_EQ(frees.reap(), 0u);
  EXPECT_TRUE(released.empty());
  second->reached = true;  // another stream's fence passes first: it is not held behind the older one
  EXPECT_EQ(frees.reap(), 1u);
  EXPECT_EQ(released, std::vector<int>({2}));
  EXPECT_EQ(first->waits, 0);  // reaping never waits
  EXPECT_EQ(frees.drain(), 1u);  // waits the rest out
  EXPECT_EQ(first->waits, 1);
  EXPECT_EQ(released, std::vector<int>({2, 1}));
  EXPECT_EQ(frees.pending(), 0u);
  EXPECT_EQ(frees.drain(), 0u);
}

class CountingHandler final : public OutOfMemoryHandler {
 public:
  bool make_room(size_t) override {
    ++asked;
    return false;
  }
  int asked = 0;
};

// The arena's side of it: a block a side stream may still use is not handed out again, and an
// allocation that finds no room waits its fence out before the memory manager is asked to evict.
TEST(DeferredFrees, TheArenaReusesADeferredBlockOnlyAfterItsFence) {
  CpuArena arena(4096);
  DeferredFrees frees;
  CountingHandler handler;
  set_deferred_frees(&frees);
  set_out_of_memory_handler(&handler);
  void* used_by_side_stream = allocate_in_arena(arena, 2048);
  void* other = allocate_in_arena(arena, 1024);
  auto fence = std::make_shared<TestFence>();
  frees.defer(fence, [&] { arena.deallocate(used_by_side_stream); });
  // Room elsewhere: served there, the deferred block untouched and its fence not waited for.
  void* small = allocate_in_arena(arena, 512);
  EXPECT_NE(small, used_by_side_stream);
  EXPECT_EQ(fence->waits, 0);
  EXPECT_EQ(frees.pending(), 1u);
  // No room: the fence is waited out, the block comes back, and nobody is evicted.
  void* big = allocate_in_arena(arena, 2048);
  EXPECT_EQ(big, used_by_side_stream);
  EXPECT_EQ(fence->waits, 1);
  EXPECT_EQ(handler.asked, 0);
  // A fence that has passed by itself: its block goes back before the next allocation looks.
  auto passed = std::make_shared<TestFence>();
  frees.defer(passed, [&] { arena.deallocate(big); });
  passed->reached = true;
  void* again = allocate_in_arena(arena, 2048);
  EXPECT_EQ(again, used_by_side_stream);
  EXPECT_EQ(passed->waits, 0);
  arena.deallocate(again);
  arena.deallocate(other);
  arena.deallocate(small);
  set_out_of_memory_handler(nullptr);
  set_deferred_frees(nullptr);
}

}  // namespace
}  // namespace ht

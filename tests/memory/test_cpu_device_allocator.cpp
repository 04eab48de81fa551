#include "memory/cpu_device_allocator.h"

#include "memory/cpu_arena.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

namespace ht {
namespace {

TEST(CpuAllocationCounter, CountsAllocationsAndFreesAndPeaks) {
  CpuAllocationCounter& counter = CpuAllocationCounter::install();
  EXPECT_EQ(&counter, &CpuAllocationCounter::install());
  const int64_t base = counter.current_bytes();
  counter.reset_peak();
  {
    at::Tensor a = at::empty({1000}, at::kFloat);
    EXPECT_EQ(counter.current_bytes() - base, 4000);
    at::Tensor b = at::relu(a);  // an ATen kernel's output is counted too
    EXPECT_EQ(counter.current_bytes() - base, 8000);
  }
  EXPECT_EQ(counter.current_bytes(), base);
  EXPECT_EQ(counter.peak_bytes() - base, 8000);
  // oneDNN allocates through raw_allocate(), which needs context == data and a raw deleter.
  void* raw = c10::GetCPUAllocator()->raw_allocate(100);
  EXPECT_EQ(counter.current_bytes() - base, 100);
  c10::GetCPUAllocator()->raw_deallocate(raw);
  EXPECT_EQ(counter.current_bytes(), base);
  counter.reset_peak();
  EXPECT_EQ(counter.peak_bytes(), base);
}

TEST(ArenaScope, ServesAtenAllocationsFromTheArenaWhileAlive) {
  auto arena = std::make_shared<CpuArena>(1 << 20);
  at::Tensor outside = at::empty({256});
  EXPECT_FALSE(arena->contains(outside.data_ptr()));
  at::Tensor inside;
  {
    ArenaScope scope(arena);
    EXPECT_EQ(active_arena(), arena.get());
    inside = at::relu(at::ones({256}));
    EXPECT_TRUE(arena->contains(inside.data_ptr()));
    EXPECT_EQ(arena->stats().blocks_in_use, 1) << "the temporary ones() went back";
    {
      HostAllocationScope host;
      at::Tensor host_buffer = at::empty({256});
      EXPECT_FALSE(arena->contains(host_buffer.data_ptr()));
    }
    EXPECT_THROW(ArenaScope second(std::make_shared<CpuArena>(1 << 20)), c10::Error) << "one device memory";
  }
  EXPECT_EQ(active_arena(), nullptr);
  // A tensor may outlive the scope it was allocated in: its block goes back to the arena, which
  // lives until then.
  std::weak_ptr<CpuArena> weak = arena;
  arena.reset();
  EXPECT_FALSE(weak.expired());
  EXPECT_TRUE(inside.equal(at::ones({256})));
  inside.reset();
  EXPECT_TRUE(weak.expired()) << "the last block freed releases the arena";
}

TEST(ArenaScope, AFullArenaAsksTheHandlerThenThrowsOutOfBudget) {
  struct FreeOnce : OutOfMemoryHandler {
    at::Tensor* victim = nullptr;
    int calls = 0;
    bool make_room(size_t) override {
      ++calls;
      if (victim == nullptr || !victim->defined()) return false;
      victim->reset();
      return true;
    }
  } handler;
  auto arena = std::make_shared<CpuArena>(8192);
  ArenaScope scope(arena);
  set_out_of_memory_handler(&handler);
  at::Tensor first = at::empty({1024});  // 4 KiB
  handler.victim = &first;
  at::Tensor second = at::empty({1536});  // 6 KiB: fits only once `first` is gone
  EXPECT_FALSE(first.defined());
  EXPECT_EQ(handler.calls, 1);
  try {
    at::Tensor third = at::empty({1024});
    FAIL() << "expected OutOfBudget";
  } catch (const OutOfBudget& e) {
    EXPECT_EQ(e.requested, 4096);
    EXPECT_EQ(e.capacity, 8192);
    EXPECT_EQ(e.in_use, 6144);
  }
  EXPECT_EQ(handler.calls, 2);
  set_out_of_memory_handler(nullptr);
}

}  // namespace
}  // namespace ht

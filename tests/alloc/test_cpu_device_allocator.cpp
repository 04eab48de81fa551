#include "alloc/cpu_device_allocator.h"

#include "alloc/arena_registry.h"
#include "alloc/cpu_arena.h"

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

// The path the CUDA allocator takes (alloc/cuda_arena.h), on an arena over host memory: the
// placement, the handler's room, the observer, and the way back through a registry of arenas.
TEST(ArenaAllocation, AnyAllocatorServesFromAnArenaTheSameWay) {
  struct Seen : AllocationObserver {
    int64_t allocated = 0, freed = 0;
    void on_allocated(const void*, int64_t bytes) override { allocated += bytes; }
    void on_freed(const void*, int64_t bytes) override { freed += bytes; }
  } seen;
  struct Refuse : OutOfMemoryHandler {
    int calls = 0;
    bool make_room(size_t) override { return ++calls, false; }
  } refuse;
  alignas(64) static char range[16 * 1024];
  auto arena = std::make_shared<CpuArena>(range, sizeof range, [](void*) {});
  ArenaRegistry arenas;
  arenas.add(arena);
  set_allocation_observer(&seen);
  set_out_of_memory_handler(&refuse);
  void* other = allocate_in_arena(*arena, 4096);  // not an activation: the top
  void* activation = nullptr;
  {
    PlacementScope forward(Placement::kActivation);
    activation = allocate_in_arena(*arena, 8192);  // at least capacity / 256: the bottom
  }
  EXPECT_EQ(activation, static_cast<void*>(range));
  EXPECT_EQ(other, static_cast<void*>(range + sizeof range - 4096));
  EXPECT_THROW(allocate_in_arena(*arena, 8192), OutOfBudget);
  EXPECT_EQ(refuse.calls, 1);
  EXPECT_EQ(release_to_arenas(arenas, activation), 8192);
  EXPECT_EQ(release_to_arenas(arenas, other), 4096);
  int elsewhere = 0;
  EXPECT_EQ(release_to_arenas(arenas, &elsewhere), -1);  // not in any arena: the caller's to free
  set_out_of_memory_handler(nullptr);
  set_allocation_observer(nullptr);
  EXPECT_EQ(seen.allocated, 12288);
  EXPECT_EQ(seen.freed, 12288);
  EXPECT_EQ(arena->stats().in_use, 0);
}

}  // namespace
}  // namespace ht

#pragma once
// ATen's CPU allocator is a process-wide singleton; this is the one place that wraps it. The
// wrapper does two things:
//  - counts the bytes ATen allocates on the CPU, whoever asks (our interpreter or libtorch's
//    autograd), so both sides of a comparison are measured by one ruler (BENCHMARKING.md);
//  - while an ArenaScope is alive, serves every CPU allocation (on any thread: ATen's workers
//    allocate too) from that arena, so a budget on a CPU rank is a real capacity. An allocation
//    that does not fit asks the OutOfMemoryHandler to make room, then throws OutOfBudget.
//  - outside an arena, keeps freed blocks for reuse when host memory caching is on
//    (alloc/host_block_cache.h): what a GPU framework's caching allocator does.
// Allocations that bypass c10's allocator (the BLAS library's own buffers) are not seen.

#include "alloc/deferred_frees.h"
#include "alloc/host_block_cache.h"
#include "alloc/out_of_memory.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

namespace ht {

class ArenaRegistry;
class CpuArena;

class CpuAllocationCounter {
 public:
  // Installs the wrapping allocator on first use; later calls return the same counter.
  static CpuAllocationCounter& install();

  // Every CPU allocation ATen makes.
  int64_t current_bytes() const;
  int64_t peak_bytes() const;
  // The rank's device memory alone: what an active arena holds, or without one what is allocated
  // while a DeviceMemoryScope is alive; never what a HostAllocationScope allocates (data sets,
  // checkpoint buffers, host copies). The same bytes with and without a budget, and the bytes
  // the planner predicts.
  int64_t device_bytes() const;
  int64_t device_peak_bytes() const;
  // Starts new peak measurements (both) from the current levels.
  void reset_peak();

 private:
  CpuAllocationCounter() = default;
};

// Sees every allocation and free in the active arena (a memory trace). Called on any thread.
class AllocationObserver {
 public:
  virtual ~AllocationObserver() = default;
  virtual void on_allocated(const void* data, int64_t bytes) = 0;
  virtual void on_freed(const void* data, int64_t bytes) = 0;
};

// Chooses where blocks go in the active arena, in bytes only: a static layout planned for a
// repeating step (alloc/step_layout.h). Advice is only advice: a range that is not free is
// allocated as if none were given, so a wrong plan costs placement, never correctness.
// Called on any thread (ATen's workers allocate too), under no lock of the allocator's or the
// arena's, for allocations in the active arena while set. An offset's on_freed is always
// reported before the arena can hand that offset out again, so the calls for one offset come in
// order even across threads.
class PlacementAdvisor {
 public:
  virtual ~PlacementAdvisor() = default;
  // Where to put a block of `rounded_bytes` (CpuArena::rounded_size): bytes from the arena's
  // base, or nullopt for no advice.
  virtual std::optional<int64_t> offset_for(int64_t rounded_bytes) = 0;
  // Where it went, and whether that was the advised offset.
  virtual void on_allocated(int64_t offset, int64_t rounded_bytes, bool as_advised) = 0;
  virtual void on_freed(int64_t offset) = 0;
  // True while the advisor's plan fills the arena's low end: a block it does not place (no
  // advice, or the advised range was taken) then goes to the high end, out of the plan's way,
  // where the arena's own placement would put it on a planned offset and displace the block
  // planned there, and that one the next.
  virtual bool holds_low_end() const { return false; }
};

// While alive, ATen's CPU allocations come from `arena` ("device memory"). One at a time; an
// arena may be made active again later. The arena stays alive (it is shared) until the last
// tensor allocated in it is freed, even if that is after the scope ends.
class ArenaScope {
 public:
  explicit ArenaScope(std::shared_ptr<CpuArena> arena);
  ~ArenaScope();
  ArenaScope(const ArenaScope&) = delete;
  ArenaScope& operator=(const ArenaScope&) = delete;

 private:
  std::shared_ptr<CpuArena> arena_;
};

// A CPU rank without a budget: while alive, CPU allocations outside a HostAllocationScope are the
// rank's device memory (CpuAllocationCounter::device_bytes), as an arena's would be. Process-wide,
// as an ArenaScope is; they nest.
class DeviceMemoryScope {
 public:
  DeviceMemoryScope();
  ~DeviceMemoryScope();
  DeviceMemoryScope(const DeviceMemoryScope&) = delete;
  DeviceMemoryScope& operator=(const DeviceMemoryScope&) = delete;
};

// Where a new block goes in the arena. The outputs of forward kernels (activations, which the
// memory manager may evict and regenerate) come from its bottom; everything else (parameters,
// optimizer state, gradients, batches, temporaries) from its top. When memory is in pieces,
// the blocks between the pieces are then activations, which can be evicted to join them
// (MemoryManager::make_room), not gradients or parameters, which cannot.
enum class Placement : uint8_t { kOther, kActivation, kRecomputed };

// Sets the placement for every thread while alive (a kernel allocates on ATen's workers too);
// restores the previous one after. The default is kOther.
class PlacementScope {
 public:
  explicit PlacementScope(Placement placement);
  ~PlacementScope();
  PlacementScope(const PlacementScope&) = delete;
  PlacementScope& operator=(const PlacementScope&) = delete;

 private:
  Placement previous_;
};

// While alive on this thread, CPU allocations bypass the arena: host buffers (checkpoint files,
// later swap space) must not take device memory.
class HostAllocationScope {
 public:
  HostAllocationScope();
  // Only where `bypass` (a rank's small host numbers kept out of its arena where the device is
  // the CPU: HostAllocationScope host(device.is_cpu())); else the allocations stay as they were.
  explicit HostAllocationScope(bool bypass);
  ~HostAllocationScope();
  HostAllocationScope(const HostAllocationScope&) = delete;
  HostAllocationScope& operator=(const HostAllocationScope&) = delete;

 private:
  bool previous_;
};

// Host blocks (every CPU tensor outside an arena) come from a cache of freed blocks while on,
// from posix_memalign and back to the system while off (the default, as for libtorch).
// Turning it off returns what the cache holds; blocks in use go back where they came from.
void set_host_memory_caching(bool on);
bool host_memory_caching();
HostCacheStats host_memory_cache_stats();

// The arena device memory comes from: the live ArenaScope's on a CPU rank, the CUDA arena
// (alloc/cuda_arena.h) on a GPU with a budget; null otherwise. One per process.
CpuArena* active_arena();
// For alloc/cuda_arena.cpp: the arena every CUDA tensor comes from, for the rest of the process.
void set_cuda_arena(CpuArena* arena);
// What an allocation in an arena goes through, whoever allocates (the CPU wrapper here, the
// CUDA allocator over its arena): the placement and the advisor's offset, the handler's room
// when the arena is full (OutOfBudget when it cannot make any), the observer. Any thread.
// Blocks a side stream still uses (set_deferred_frees) go back first as their fences pass, and
// when the arena is full their fences are waited out before the handler is asked.
// `block_bytes`, if given, gets the block's rounded size.
void* allocate_in_arena(CpuArena& arena, size_t n, int64_t* block_bytes = nullptr);
// Gives `data` back to the arena in `arenas` that holds it (advisor and observer told); returns
// its rounded size, or -1 when no arena holds it (nullptr included).
int64_t release_to_arenas(ArenaRegistry& arenas, void* data);
// Who is asked to make room when the active arena is full (the memory manager running a kernel).
void set_out_of_memory_handler(OutOfMemoryHandler* handler);
OutOfMemoryHandler* out_of_memory_handler();
void set_allocation_observer(AllocationObserver* observer);
// Where blocks freed while a side stream may still use them wait (alloc/deferred_frees.h): the
// CUDA allocator's (alloc/cuda_arena.cpp); null (the default): none. Must outlive every allocation.
void set_deferred_frees(DeferredFrees* frees);
// Who places blocks in the active arena (null: none, the default). The advisor must outlive
// every allocation and free that may still be calling it; set it back to null first.
void set_placement_advisor(PlacementAdvisor* advisor);

}  // namespace ht

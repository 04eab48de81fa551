#include "alloc/cpu_device_allocator.h"

#include "alloc/arena_registry.h"
#include "alloc/cpu_arena.h"
#include "alloc/host_block_cache.h"
#include "base/compat.h"

#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <new>
#include <optional>
#include <vector>

namespace ht {
namespace {

std::atomic<CpuArena*> g_active_arena{nullptr};
std::atomic<CpuArena*> g_cuda_arena{nullptr};
std::atomic<OutOfMemoryHandler*> g_oom_handler{nullptr};
std::atomic<AllocationObserver*> g_observer{nullptr};
std::atomic<DeferredFrees*> g_deferred{nullptr};
std::atomic<PlacementAdvisor*> g_advisor{nullptr};
// Process-wide, not per thread: a kernel's allocations on ATen's worker threads belong with it.
std::atomic<Placement> g_placement{Placement::kOther};
thread_local bool t_host_allocation = false;
// DeviceMemoryScopes alive: host-served allocations outside a HostAllocationScope are device memory.
std::atomic<int> g_device_scopes{0};

[[noreturn]] void throw_out_of_budget(const CpuArena& arena, size_t n) {
  const ArenaStats s = arena.stats();
  throw OutOfBudget("out of device memory: " + std::to_string(n) + " bytes asked, " + std::to_string(s.in_use) +
                        " of " + std::to_string(s.capacity) + " in use, largest free block " +
                        std::to_string(s.largest_free_block),
                    static_cast<int64_t>(n), s.in_use, s.capacity, s.largest_free_block);
}

// The block at the advisor's offset, or null (no advice, or the range is not free). Tried
// once, before the usual placement: making room evicts by the memory manager's choice, which
// need not free the planned range, so retrying it after would rarely help.
void* advised(CpuArena& arena, PlacementAdvisor& advisor, size_t n) {
  if (n > static_cast<size_t>(arena.capacity())) return nullptr;  // fails below, as ever
  const std::optional<int64_t> offset = advisor.offset_for(CpuArena::rounded_size(n));
  return offset.has_value() ? arena.allocate_at(*offset, n) : nullptr;
}

// Before the arena takes the block back: once it has, another thread may be given the same
// offset, and its on_allocated must not reach the advisor ahead of this on_freed. Only the
// active arena's blocks: the advisor's offsets mean nothing in a retired one.
void report_free_to_advisor(const void* data) {
  PlacementAdvisor* advisor = g_advisor.load(std::memory_order_acquire);
  if (advisor == nullptr) return;
  const CpuArena* arena = active_arena();
  if (arena == nullptr || !arena->contains(data)) return;
  const int64_t offset = arena->offset_of_block(data);
  if (offset >= 0) advisor->on_freed(offset);
}

void report_free_to_observer(const void* data, int64_t bytes) {
  if (AllocationObserver* o = g_observer.load(std::memory_order_acquire)) o->on_freed(data, bytes);
}

// Owns CPU memory directly: from the active arena, or from the host (the block cache, or
// posix_memalign) with a small header recording the block's size and where it came from. The
// DataPtr's context is its data pointer and raw_deleter() is set, because oneDNN allocates
// through raw_allocate(), which requires both.
class DeviceAllocator final : public c10::Allocator {
 public:
  static constexpr size_t kAlignment = 64;  // what c10's CPU allocator guarantees
  static constexpr size_t kHeader = kAlignment;

  c10::DataPtr allocate(size_t n) HT_ALLOCATE_CONST override {
    if (n == 0) return {nullptr, nullptr, &DeviceAllocator::release, c10::Device(c10::kCPU)};
    CpuArena* arena = g_active_arena.load(std::memory_order_acquire);
    void* data = arena != nullptr && !t_host_allocation ? from_arena(*arena, n) : from_host(n);
    return {data, data, &DeviceAllocator::release, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &DeviceAllocator::release; }
  HT_ALLOCATOR_COPY_DATA

  static DeviceAllocator& instance();
  ArenaRegistry& registry() { return registry_; }

  int64_t current() const { return all_.current(); }
  int64_t peak() const { return all_.peak(); }
  int64_t device_current() const { return device_.current(); }
  int64_t device_peak() const { return device_.peak(); }
  void reset_peak() {
    all_.reset_peak();
    device_.reset_peak();
  }
  HostBlockCache& cache() { return cache_; }
  // Blocks already handed out keep going where they came from (their header says).
  void set_caching(bool on) {
    caching_.store(on, std::memory_order_relaxed);
    if (!on) cache_.trim();
  }
  bool caching() const { return caching_.load(std::memory_order_relaxed); }

 private:
  void* from_arena(CpuArena& arena, size_t n) const {
    int64_t bytes = 0;
    void* data = allocate_in_arena(arena, n, &bytes);
    all_.add(bytes);
    device_.add(bytes);  // an arena is device memory
    return data;
  }
  // Precedes every host block: what the counters added, and the cache's capacity (0: malloc'd).
  struct HostHeader {
    int64_t bytes;
    int64_t device_bytes;  // bytes, or 0 if it is not device memory (DeviceMemoryScope)
    int64_t cached_capacity;
  };
  static_assert(sizeof(HostHeader) <= kHeader, "the header must fit in front of an aligned block");

  void* from_host(size_t n) const {
    void* base = nullptr;
    size_t capacity = 0;
    if (caching_.load(std::memory_order_relaxed)) {
      base = cache_.allocate(n + kHeader, capacity);
    } else if (posix_memalign(&base, kAlignment, n + kHeader) != 0) {
      throw std::bad_alloc();
    }
    const bool device = g_device_scopes.load(std::memory_order_relaxed) > 0 && !t_host_allocation;
    const auto bytes = static_cast<int64_t>(n);
    *static_cast<HostHeader*>(base) = {bytes, device ? bytes : 0, static_cast<int64_t>(capacity)};
    all_.add(bytes);
    if (device) device_.add(bytes);
    return static_cast<char*>(base) + kHeader;
  }
  static void release(void* data) {
    if (data == nullptr) return;
    DeviceAllocator& self = instance();
    const int64_t arena_bytes = release_to_arenas(self.registry_, data);
    if (arena_bytes >= 0) {
      self.all_.sub(arena_bytes);
      self.device_.sub(arena_bytes);
      return;
    }
    void* base = static_cast<char*>(data) - kHeader;
    const HostHeader header = *static_cast<HostHeader*>(base);
    self.all_.sub(header.bytes);
    self.device_.sub(header.device_bytes);
    if (header.cached_capacity > 0) {
      self.cache_.release(base, static_cast<size_t>(header.cached_capacity), self.caching());
    } else {
      std::free(base);
    }
  }
  // Bytes in use and their peak, updated from any thread.
  class Level {
   public:
    void add(int64_t bytes) {
      const int64_t now = current_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
      int64_t seen = peak_.load(std::memory_order_relaxed);
      while (now > seen && !peak_.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
      }
    }
    void sub(int64_t bytes) { current_.fetch_sub(bytes, std::memory_order_relaxed); }
    int64_t current() const { return current_.load(std::memory_order_relaxed); }
    int64_t peak() const { return peak_.load(std::memory_order_relaxed); }
    void reset_peak() { peak_.store(current(), std::memory_order_relaxed); }

   private:
    std::atomic<int64_t> current_{0}, peak_{0};
  };

  ArenaRegistry registry_;
  mutable HostBlockCache cache_;
  std::atomic<bool> caching_{false};
  mutable Level all_, device_;
};

DeviceAllocator& DeviceAllocator::instance() {
  // Never destroyed: tensors freed during static destruction still call release().
  static DeviceAllocator* allocator = [] {
    auto* a = new DeviceAllocator();
    c10::SetCPUAllocator(a, /*priority=*/1);
    return a;
  }();
  return *allocator;
}

}  // namespace

CpuAllocationCounter& CpuAllocationCounter::install() {
  DeviceAllocator::instance();
  static CpuAllocationCounter counter;
  return counter;
}

int64_t CpuAllocationCounter::current_bytes() const { return DeviceAllocator::instance().current(); }
int64_t CpuAllocationCounter::peak_bytes() const { return DeviceAllocator::instance().peak(); }
void CpuAllocationCounter::reset_peak() { DeviceAllocator::instance().reset_peak(); }
int64_t CpuAllocationCounter::device_bytes() const { return DeviceAllocator::instance().device_current(); }
int64_t CpuAllocationCounter::device_peak_bytes() const { return DeviceAllocator::instance().device_peak(); }

DeviceMemoryScope::DeviceMemoryScope() { g_device_scopes.fetch_add(1, std::memory_order_relaxed); }
DeviceMemoryScope::~DeviceMemoryScope() { g_device_scopes.fetch_sub(1, std::memory_order_relaxed); }

void set_host_memory_caching(bool on) { DeviceAllocator::instance().set_caching(on); }
bool host_memory_caching() { return DeviceAllocator::instance().caching(); }
HostCacheStats host_memory_cache_stats() { return DeviceAllocator::instance().cache().stats(); }

ArenaScope::ArenaScope(std::shared_ptr<CpuArena> arena) : arena_(std::move(arena)) {
  TORCH_CHECK(arena_ != nullptr, "ArenaScope: no arena");
  TORCH_CHECK(active_arena() == nullptr, "ArenaScope: another arena is already active (one device memory per process)");
  // Registered before it serves anything, so every block it hands out can be given back.
  DeviceAllocator::instance().registry().add(arena_);
  g_active_arena.store(arena_.get(), std::memory_order_release);
}

ArenaScope::~ArenaScope() {
  g_active_arena.store(nullptr, std::memory_order_release);
  DeviceAllocator::instance().registry().retire(arena_.get());
}

PlacementScope::PlacementScope(Placement placement)
    : previous_(g_placement.exchange(placement, std::memory_order_relaxed)) {}
PlacementScope::~PlacementScope() { g_placement.store(previous_, std::memory_order_relaxed); }

HostAllocationScope::HostAllocationScope() : previous_(t_host_allocation) { t_host_allocation = true; }
HostAllocationScope::HostAllocationScope(bool bypass) : previous_(t_host_allocation) {
  t_host_allocation = previous_ || bypass;
}
HostAllocationScope::~HostAllocationScope() { t_host_allocation = previous_; }

CpuArena* active_arena() {
  CpuArena* cpu = g_active_arena.load(std::memory_order_acquire);
  return cpu != nullptr ? cpu : g_cuda_arena.load(std::memory_order_acquire);
}
void set_cuda_arena(CpuArena* arena) { g_cuda_arena.store(arena, std::memory_order_release); }

void* allocate_in_arena(CpuArena& arena, size_t n, int64_t* block_bytes) {
  const Placement placement = g_placement.load(std::memory_order_relaxed);
  const CpuArena::End end = arena.end_for(n, placement != Placement::kOther, placement == Placement::kRecomputed);
  // Loaded once, so the advisor that advised is the one told the outcome.
  PlacementAdvisor* advisor = g_advisor.load(std::memory_order_acquire);
  DeferredFrees* deferred = g_deferred.load(std::memory_order_acquire);
  if (deferred != nullptr) deferred->reap();  // what side streams are done with goes back first
  void* data = advisor != nullptr ? advised(arena, *advisor, n) : nullptr;
  const bool as_advised = data != nullptr;
  if (data == nullptr) data = arena.allocate(n, advisor != nullptr && advisor->holds_low_end() ? CpuArena::End::kHigh : end);
  if (data == nullptr && deferred != nullptr && deferred->drain() > 0) data = arena.allocate(n, end);
  while (data == nullptr) {
    OutOfMemoryHandler* handler = g_oom_handler.load(std::memory_order_acquire);
    if (handler == nullptr || !handler->make_room(n)) throw_out_of_budget(arena, n);
    data = arena.allocate(n, end);
  }
  const int64_t bytes = arena.block_bytes(data);
  if (AllocationObserver* o = g_observer.load(std::memory_order_acquire)) o->on_allocated(data, bytes);
  if (advisor != nullptr) advisor->on_allocated(arena.offset_of_block(data), bytes, as_advised);
  if (block_bytes != nullptr) *block_bytes = bytes;
  return data;
}

int64_t release_to_arenas(ArenaRegistry& arenas, void* data) {
  if (data == nullptr) return -1;
  report_free_to_advisor(data);
  const int64_t bytes = arenas.release(data);
  if (bytes >= 0) report_free_to_observer(data, bytes);
  return bytes;
}
void set_deferred_frees(DeferredFrees* frees) { g_deferred.store(frees, std::memory_order_release); }
void set_out_of_memory_handler(OutOfMemoryHandler* handler) { g_oom_handler.store(handler, std::memory_order_release); }
OutOfMemoryHandler* out_of_memory_handler() { return g_oom_handler.load(std::memory_order_acquire); }
void set_allocation_observer(AllocationObserver* observer) { g_observer.store(observer, std::memory_order_release); }
void set_placement_advisor(PlacementAdvisor* advisor) { g_advisor.store(advisor, std::memory_order_release); }

}  // namespace ht

#include "alloc/meta_arena.h"

#include "alloc/arena_registry.h"
#include "alloc/cpu_device_allocator.h"
#include "base/compat.h"

#include <c10/core/Allocator.h>

#include <atomic>
#include <string>
#include <sys/mman.h>
#include <stdexcept>

namespace ht {
namespace {

std::atomic<CpuArena*> g_meta_arena{nullptr};

// libtorch's meta allocator hands out no storage (a null pointer); this one hands out blocks of
// the live scope's arena, whose addresses no kernel reads (meta kernels touch no data). The
// DataPtr's context is its pointer, as the CPU allocator's is.
class MetaAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) HT_ALLOCATE_CONST override {
    CpuArena* arena = g_meta_arena.load(std::memory_order_acquire);
    if (n == 0 || arena == nullptr) return {nullptr, nullptr, &MetaAllocator::release, c10::Device(c10::kMeta)};
    void* data = allocate_in_arena(*arena, n);
    return {data, data, &MetaAllocator::release, c10::Device(c10::kMeta)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &MetaAllocator::release; }
  HT_ALLOCATOR_NO_COPY_DATA  // the blocks hold no values: nothing to copy

  static MetaAllocator& instance() {
    static MetaAllocator* allocator = [] {
      static MetaAllocator a;
      c10::SetAllocator(c10::DeviceType::Meta, &a, /*priority=*/1);  // over libtorch's (0)
      return &a;
    }();
    return *allocator;
  }
  ArenaRegistry& registry() { return registry_; }

 private:
  static void release(void* data) { release_to_arenas(instance().registry_, data); }
  ArenaRegistry registry_;
};

}  // namespace

MetaArenaScope::MetaArenaScope(std::shared_ptr<CpuArena> arena) : arena_(std::move(arena)) {
  if (arena_ == nullptr) throw std::logic_error("MetaArenaScope: no arena");
  MetaAllocator& allocator = MetaAllocator::instance();
  allocator.registry().add(arena_);  // before it serves anything
  CpuArena* none = nullptr;
  if (!g_meta_arena.compare_exchange_strong(none, arena_.get(), std::memory_order_acq_rel)) {
    allocator.registry().retire(arena_.get());
    throw std::logic_error("MetaArenaScope: another is already alive (one per process)");
  }
}

MetaArenaScope::~MetaArenaScope() {
  g_meta_arena.store(nullptr, std::memory_order_release);
  MetaAllocator::instance().registry().retire(arena_.get());
}

CpuArena* active_meta_arena() { return g_meta_arena.load(std::memory_order_acquire); }

std::shared_ptr<CpuArena> make_meta_arena(int64_t capacity) {
  const auto bytes = static_cast<size_t>(capacity);
  void* base = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) {
    throw std::runtime_error("cannot reserve " + std::to_string(capacity) + " bytes of address space for a step traced "
                             "on meta tensors (is the virtual memory limited, ulimit -v?)");
  }
  return std::make_shared<CpuArena>(base, capacity, [bytes](void* p) { munmap(p, bytes); });
}

}  // namespace ht

#include "memory/cpu_allocation_counter.h"

#include "runtime/compat.h"

#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstdlib>
#include <new>

namespace ht {
namespace {

// Owns CPU memory directly (posix_memalign) with a small header recording each block's size.
// The DataPtr's context is its data pointer and raw_deleter() is set, because oneDNN allocates
// through raw_allocate(), which requires both.
class CountingAllocator final : public c10::Allocator {
 public:
  static constexpr size_t kAlignment = 64;  // what c10's CPU allocator guarantees
  static constexpr size_t kHeader = kAlignment;

  c10::DataPtr allocate(size_t n) HT_ALLOCATE_CONST override {
    if (n == 0) return {nullptr, nullptr, &CountingAllocator::release, c10::Device(c10::kCPU)};
    void* base = nullptr;
    if (posix_memalign(&base, kAlignment, n + kHeader) != 0) throw std::bad_alloc();
    *static_cast<int64_t*>(base) = static_cast<int64_t>(n);
    add(static_cast<int64_t>(n));
    void* data = static_cast<char*>(base) + kHeader;
    return {data, data, &CountingAllocator::release, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &CountingAllocator::release; }
  HT_ALLOCATOR_COPY_DATA

  static CountingAllocator& instance();

  int64_t current() const { return current_.load(std::memory_order_relaxed); }
  int64_t peak() const { return peak_.load(std::memory_order_relaxed); }
  void reset_peak() { peak_.store(current(), std::memory_order_relaxed); }

 private:
  static void release(void* data) {
    if (data == nullptr) return;
    void* base = static_cast<char*>(data) - kHeader;
    instance().current_.fetch_sub(*static_cast<int64_t*>(base), std::memory_order_relaxed);
    std::free(base);
  }

  void add(int64_t bytes) const {
    const int64_t now = current_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    int64_t seen = peak_.load(std::memory_order_relaxed);
    while (now > seen && !peak_.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
    }
  }

  mutable std::atomic<int64_t> current_{0};
  mutable std::atomic<int64_t> peak_{0};
};

CountingAllocator& CountingAllocator::instance() {
  // Never destroyed: tensors freed during static destruction still call release().
  static CountingAllocator* allocator = [] {
    auto* a = new CountingAllocator();
    c10::SetCPUAllocator(a, /*priority=*/1);
    return a;
  }();
  return *allocator;
}

}  // namespace

CpuAllocationCounter& CpuAllocationCounter::install() {
  CountingAllocator::instance();
  static CpuAllocationCounter counter;
  return counter;
}

int64_t CpuAllocationCounter::current_bytes() const { return CountingAllocator::instance().current(); }
int64_t CpuAllocationCounter::peak_bytes() const { return CountingAllocator::instance().peak(); }
void CpuAllocationCounter::reset_peak() { CountingAllocator::instance().reset_peak(); }

}  // namespace ht

#include "alloc/memory_timeline.h"

#include "alloc/cpu_arena.h"

namespace ht {

MemoryTimeline::MemoryTimeline(const std::string& path, const CpuArena* arena) : trace_(path), arena_(arena) {
  set_allocation_observer(this);
}

MemoryTimeline::~MemoryTimeline() { set_allocation_observer(nullptr); }

double MemoryTimeline::now_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start_).count();
}

void MemoryTimeline::sample_in_use(double ts) {
  if (arena_ != nullptr) trace_.counter("device memory", ts, {{"in_use", static_cast<double>(arena_->stats().in_use)}});
}

void MemoryTimeline::kernel(const char* op, bool recompute, double ms) {
  if (!recording()) return;
  const double end = now_us();
  trace_.span(op, recompute ? "recompute" : "kernel", end - ms * 1e3, ms * 1e3);
}

void MemoryTimeline::evicted(const char* op, uint64_t tensor_id, int64_t bytes) {
  if (!recording()) return;
  trace_.instant(std::string("evict ") + op, "evict", now_us(),
                 {{"tensor", static_cast<double>(tensor_id)}, {"bytes", static_cast<double>(bytes)}});
}

void MemoryTimeline::copy(bool to_host, uint64_t tensor_id, int64_t bytes, std::chrono::steady_clock::time_point start,
                          std::chrono::steady_clock::time_point end) {
  if (!recording()) return;
  const double ts = std::chrono::duration<double, std::micro>(start - start_).count();
  const double dur = std::chrono::duration<double, std::micro>(end - start).count();
  trace_.span(to_host ? "swap out" : "swap in", to_host ? "swap_out" : "swap_in", ts, dur,
              {{"tensor", static_cast<double>(tensor_id)}, {"bytes", static_cast<double>(bytes)}}, to_host ? 2 : 3);
}

void MemoryTimeline::copy_wait(uint64_t tensor_id, double ms) {
  if (!recording()) return;
  const double end = now_us();
  trace_.span("swap wait", "swap_wait", end - ms * 1e3, ms * 1e3, {{"tensor", static_cast<double>(tensor_id)}});
}

void MemoryTimeline::marker(const std::string& name) {
  if (recording()) trace_.instant(name, "step", now_us());
}

void MemoryTimeline::on_allocated(const void* /*data*/, int64_t bytes) {
  if (!recording()) return;
  const double ts = now_us();
  trace_.instant("alloc", "memory", ts, {{"bytes", static_cast<double>(bytes)}});
  sample_in_use(ts);
}

void MemoryTimeline::on_freed(const void* /*data*/, int64_t bytes) {
  if (!recording()) return;
  const double ts = now_us();
  trace_.instant("free", "memory", ts, {{"bytes", static_cast<double>(bytes)}});
  sample_in_use(ts);
}

}  // namespace ht

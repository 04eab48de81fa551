#include "alloc/arena_registry.h"

#include <utility>

namespace ht {

void ArenaRegistry::add(std::shared_ptr<CpuArena> arena) {
  std::lock_guard<std::mutex> lock(mu_);
  for (Entry& e : entries_) {
    if (e.arena == arena) {  // active again (benchmarks switch between arenas)
      e.retired = false;
      return;
    }
  }
  entries_.push_back({std::move(arena), false});
  size_.store(entries_.size(), std::memory_order_release);
}

void ArenaRegistry::retire(const CpuArena* arena) {
  std::shared_ptr<CpuArena> last;  // destroyed outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (entries_[i].arena.get() != arena) continue;
    entries_[i].retired = true;
    if (arena->stats().blocks_in_use == 0) last = erase(i);
    return;
  }
}

int64_t ArenaRegistry::release(void* data) {
  if (size_.load(std::memory_order_acquire) == 0) return -1;
  std::shared_ptr<CpuArena> last;
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < entries_.size(); ++i) {
    CpuArena& arena = *entries_[i].arena;
    if (!arena.contains(data)) continue;
    const int64_t bytes = arena.block_bytes(data);
    arena.deallocate(data);
    if (entries_[i].retired && arena.stats().blocks_in_use == 0) last = erase(i);
    return bytes;
  }
  return -1;
}

ArenaRegistry::Held ArenaRegistry::retired_but_held() {
  std::lock_guard<std::mutex> lock(mu_);
  Held held;
  for (const Entry& e : entries_) {
    if (!e.retired) continue;
    const ArenaStats stats = e.arena->stats();
    ++held.arenas;
    held.capacity += stats.capacity;
    held.in_use += stats.in_use;
  }
  return held;
}

std::shared_ptr<CpuArena> ArenaRegistry::erase(size_t i) {
  std::shared_ptr<CpuArena> arena = std::move(entries_[i].arena);
  entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(i));
  size_.store(entries_.size(), std::memory_order_release);
  return arena;
}

}  // namespace ht

#include "alloc/deferred_frees.h"

namespace ht {

void DeferredFrees::defer(std::shared_ptr<Fence> fence, std::function<void()> release) {
  std::lock_guard<std::mutex> lock(mutex_);
  entries_.push_back({std::move(fence), std::move(release)});
  pending_.store(entries_.size(), std::memory_order_release);
}

std::deque<DeferredFrees::Entry> DeferredFrees::take(bool all) {
  std::deque<Entry> taken;
  std::lock_guard<std::mutex> lock(mutex_);
  if (all) {
    taken.swap(entries_);
  } else {
    // Fences of different streams pass out of order: every entry is asked, not just the oldest.
    std::deque<Entry> kept;
    for (Entry& e : entries_) (e.fence->passed() ? taken : kept).push_back(std::move(e));
    entries_.swap(kept);
  }
  pending_.store(entries_.size(), std::memory_order_release);
  return taken;
}

size_t DeferredFrees::release_all(std::deque<Entry> entries, bool wait) {
  for (Entry& e : entries) {
    if (wait) e.fence->wait();
    e.release();
  }
  return entries.size();
}

size_t DeferredFrees::reap() {
  if (pending() == 0) return 0;
  return release_all(take(false), false);
}

size_t DeferredFrees::drain() {
  if (pending() == 0) return 0;
  return release_all(take(true), true);
}

}  // namespace ht

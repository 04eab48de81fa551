#pragma once
// Blocks a side stream may still use when the host frees them (issue 67). On a GPU the host
// queues kernels and moves on: a tensor made while a communication stream is ATen's current
// stream (a collective's padded copy, a scale's temporary) is freed on the host as soon as its
// kernels are queued, before they run. An arena that handed the block to the compute stream's
// next kernel at once would let that kernel overwrite it under the side stream's. PyTorch's
// caching allocator keeps such a block back until an event recorded on the using stream at the
// free has passed (what record_stream arranges); DeferredFrees does that for hybrid_train's
// allocators: the block waits here with its fence and goes back to its allocator once the fence
// has passed, and an allocation that finds no room waits the fences out before the memory manager
// is asked to evict (allocate_in_arena).
//
// Plain C++ over an interface: CUDA events are one kind of fence (alloc/cuda_arena.cpp), and
// tests hold the logic on CPU ranks with fences that pass when the test says.

#include <atomic>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>

namespace ht {

// A point in a stream's queue.
class Fence {
 public:
  virtual ~Fence() = default;
  // Whether everything queued on the stream before the fence has run. Never blocks.
  virtual bool passed() = 0;
  // Until it has, on the host.
  virtual void wait() = 0;
};

class DeferredFrees {
 public:
  // Holds a block until `fence` has passed; then `release` gives it back to its allocator.
  void defer(std::shared_ptr<Fence> fence, std::function<void()> release);
  // Gives back every block whose fence has passed; returns how many. Cheap when none waits.
  size_t reap();
  // Waits every fence out on the host and gives every block back: what an allocation that found
  // no room does before anything is evicted. Returns how many.
  size_t drain();
  size_t pending() const { return pending_.load(std::memory_order_acquire); }

 private:
  struct Entry {
    std::shared_ptr<Fence> fence;
    std::function<void()> release;
  };
  // Takes the entries to give back (all, or those whose fence has passed) out under the lock;
  // they are released after it, since a release goes back into the allocator.
  std::deque<Entry> take(bool all);
  static size_t release_all(std::deque<Entry> entries, bool wait);

  std::mutex mutex_;
  std::deque<Entry> entries_;
  std::atomic<size_t> pending_{0};
};

}  // namespace ht

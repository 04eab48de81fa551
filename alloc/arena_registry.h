#pragma once
// Arenas that may still hold blocks: the live scope's, and retired ones until their last block
// is freed (a tensor may outlive the scope it was allocated in). One per allocator that serves
// from arenas: ATen's CPU allocator (cpu_device_allocator.h) and the CUDA one (cuda_arena.h).

#include "alloc/cpu_arena.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace ht {

class ArenaRegistry {
 public:
  // Registered before it serves anything, so every block it hands out can be given back.
  void add(std::shared_ptr<CpuArena> arena);
  // Its scope ended: dropped once its last block is freed (now, if none is in use).
  void retire(const CpuArena* arena);
  // Frees `data` if an arena holds it; returns its block size, or -1 if no arena holds it.
  int64_t release(void* data);
  // Retired arenas that live on because a block is still in use: how many, and their capacity
  // (what an out-of-memory message names, since a GPU arena holds its whole cudaMalloc block).
  struct Held {
    int arenas = 0;
    int64_t capacity = 0;
    int64_t in_use = 0;
  };
  Held retired_but_held();

 private:
  struct Entry {
    std::shared_ptr<CpuArena> arena;
    bool retired;
  };
  std::shared_ptr<CpuArena> erase(size_t i);
  std::mutex mu_;
  std::vector<Entry> entries_;
  std::atomic<size_t> size_{0};
};

}  // namespace ht

#pragma once
// Coop's window over a real arena: the arena's blocks in address order as cheapest_window
// (eviction_score.h) reads them. The engine (MemoryManager::evict_window) and the planner's
// replay (planner/dtr_replay.cpp) both call it, each naming its own tensors by block offset.

#include "alloc/cpu_arena.h"
#include "memory/eviction_score.h"

#include <cstdint>
#include <optional>
#include <vector>

namespace ht {

// The offsets, in address order, of the evictable blocks in the cheapest window of `arena` that
// spans `need` bytes; empty if none does. `cost(offset)` is what evicting the allocated block at
// `offset` costs (window_cost), or nullopt if it cannot go (it ends a window). Free gaps cost 0.
template <typename Cost>
std::vector<int64_t> cheapest_window_offsets(const CpuArena& arena, int64_t need, Cost&& cost) {
  std::vector<ArenaBlock> blocks;
  std::vector<int64_t> offsets;  // of each block; -1 for a free gap
  int64_t at = 0;
  for (const auto& [offset, size] : arena.allocated_blocks()) {
    if (offset > at) {
      blocks.push_back(ArenaBlock{offset - at, true, 0});
      offsets.push_back(-1);
    }
    const std::optional<double> c = cost(offset);
    blocks.push_back(ArenaBlock{size, c.has_value(), c.value_or(0)});
    offsets.push_back(offset);
    at = offset + size;
  }
  if (arena.capacity() > at) {
    blocks.push_back(ArenaBlock{arena.capacity() - at, true, 0});
    offsets.push_back(-1);
  }
  const auto [first, last] = cheapest_window(blocks, need);
  std::vector<int64_t> out;
  for (int64_t i = first; i >= 0 && i < last; ++i) {
    if (offsets[static_cast<size_t>(i)] >= 0) out.push_back(offsets[static_cast<size_t>(i)]);
  }
  return out;
}

}  // namespace ht

#pragma once
// Offline DTR replay (the DTR paper's simulator approach): runs a recorded step (step_trace.h)
// through the memory manager's eviction rules at a smaller budget, without running any kernel,
// to predict evictions, recomputation and whether the budget works at all. Its scores, its choice
// of the victim and DTR's e* are the engine's own code (memory/eviction_score.h), on the engine's
// clock (one tick per kernel); its loop mirrors memory/memory_manager.cpp (prepare, make_room:
// Coop's cheapest window, else fragmentation-first victims) and runtime/interpreter_residency.cpp (regeneration), and it places
// blocks in a real CpuArena of the budget's size (address space only), so fragmentation is the
// engine's own. On a step without views it evicts what the engine evicts, in the same order
// (tests/planner/test_replay_engine.cpp). Where it departs from the engine, for want of what a
// trace does not record:
//  - a freed tensor with a recomputable producer is taken for a dropped record that a later op
//    call's lineage still holds: it counts in e* and is regenerated in passing, as materialize
//    does. Records nothing refers to are gone in the engine, so late in backward e* may count a
//    few more than the engine sees;
//  - a regeneration allocates only the outputs it attaches, not the kernel's other outputs and
//    temporaries, and is not run again for room (a kernel of the step is, as run_with_room runs
//    a kernel that threw OutOfBudget again: what it held released, room made for all of it);
//  - no views (a view's reads count as its root's), no sqrt sampling (off by default in the
//    engine); dtr_eq and megengine are replayed as dtr, whose classes and free neighbours differ.

#include "memory/eviction_policy.h"
#include "planner/step_trace.h"
#include "schedule/block_recorder.h"

#include <cstdint>

#include <string>
#include <vector>

namespace ht {

struct ReplayOptions {
  int64_t budget_bytes = 0;          // arena capacity; must be positive
  double eviction_threshold = 0.9;   // as memory.eviction_threshold
  // dtr, lru and largest as the engine scores them; dtr_eq and megengine are replayed as dtr.
  EvictionHeuristic policy = EvictionHeuristic::kDtr;
  bool ignore_small = true;          // as EvictionOptions::ignore_small
  bool window = true;                // as EvictionOptions::window (Coop's sliding window)
  bool modeled_costs = true;         // as memory.kernel_costs = "modeled": score by TraceKernel::modeled_ms
  // memory.policy = "full" (MemoryOptions::checkpoint_blocks): the model's blocks; when a forward
  // kernel of another block begins, what the block before made is dropped but its last kernel's
  // outputs (a view's: what it reads), as the engine's block_begins does. 0: off.
  int checkpoint_blocks = 0;
  // memory.policy = "per_block" (MemoryOptions::block_keep_bytes): with checkpoint_blocks, each
  // block keeps what its plan chooses within these bytes, as the engine's. 0: none (full).
  int64_t block_keep_bytes = 0;
  double block_keep_share = 0;  // as MemoryOptions::block_keep_share
  // memory.block_offload: the host link the blocks' plans may offload over (as the engine's
  // block_link). An offloaded value is dropped when its block ends (its copy taken as done: the
  // engine's may run beside the next block) and comes back in backward without recomputation;
  // evicting it again later costs nothing (its host copy stays), and eviction takes such values
  // first, largest first, as host swap's does.
  schedule::BlockLink block_link;
};

struct ReplayResult {
  bool feasible = true;          // false: some allocation could not fit even with everything evictable
                                 // evicted, or a tensor needed again could not be regenerated
  int64_t peak_bytes = 0;        // highest arena in_use (rounded blocks, persistent included)
  int64_t forward_end_bytes = 0;  // arena in_use when the first backward kernel began
  int64_t evictions = 0;         // DTR's, and checkpoint_blocks' drops
  // The budget acted: some allocation found no free block that fits, the bytes in use passed
  // the eviction threshold, a prefetch stopped at it, or a block went where the arena's capacity
  // put it (CpuArena::placed_by_capacity). Where it did not, the replay at any larger budget of
  // the same small blocks is this one (planner/recompute_terms.cpp, held_from_below).
  bool budget_acted = false;
  int64_t window_evictions = 0;  // of those, made by windows (as MemoryStats::window_evictions)
  int64_t recomputations = 0;    // kernels re-run to regenerate
  double recompute_ms = 0;       // sum of their TraceKernel::ms
  int64_t min_budget_bytes = 0;  // when infeasible for lack of room: in_use + the request that
                                 // failed (as MemoryStats::min_budget_bytes); 0 otherwise
  std::string failure;           // when infeasible: one sentence naming the kernel index and bytes
  std::vector<int> victims;      // the tensors evicted, in order (trace indices)
  std::vector<double> victim_scores;  // each one's score when it went (memory/eviction_score.h)
  // block_link: bytes offloaded to host and brought back, and the link's time the blocks' compute
  // does not hide (their plans' link_ms, once per block dropped).
  int64_t offload_out_bytes = 0, offload_in_bytes = 0;
  double offload_exposed_ms = 0;
  // checkpoint_blocks with a per-block plan (block_keep_*): each distinct block and its plan.
  std::vector<schedule::SolvedBlock> blocks;
};

// Throws std::invalid_argument if budget_bytes <= 0 or the trace names a tensor or kernel out
// of range. The replay stops at the first failure; counters then cover the events before it.
ReplayResult replay_step(const StepTrace& trace, const ReplayOptions& options);

}  // namespace ht

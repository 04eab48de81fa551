#pragma once
// memory.policy and its sibling choices as enums (base/choice.h), with the questions the code
// asks of them. Parsed once, at the config's boundary (launcher/config/); the trainer, the
// planner's search and its predictions all branch on these, never on names.

#include "base/choice.h"
#include "memory/eviction_policy.h"

#include <cstdint>
#include <optional>

namespace ht {

enum class MemoryPolicy : uint8_t {
  kNone,      // never evict: the budget is a hard limit
  kStatic,    // a static plan for each op sequence from its first step, DTR for steps that leave it
  kAuto,      // a static plan once a sequence repeats, DTR otherwise
  kSegments,  // torch's checkpoint_sequential: sqrt(n) segments of blocks, recomputed whole
  kFull,      // Megatron's full recomputation: each block's activations dropped at its end, but its output
  kDtr,       // DTR by one of its eviction heuristics (memory/eviction_policy.h)
  kDtrEq,
  kMegEngine,
  kLru,
  kLargest,
  kSwap,      // vDNN: convolution and matmul outputs copied to host memory, DTR for the rest
  kHybrid,    // Capuchin: swap what the link hides under forward, recompute the rest by DTR
  kPerBlock,  // each block keeps what its solved plan keeps in memory.block_keep, the rest as full
};
template <>
struct ChoiceNames<MemoryPolicy> {
  static constexpr std::pair<MemoryPolicy, const char*> table[] = {
      {MemoryPolicy::kNone, "none"},         {MemoryPolicy::kStatic, "static"},
      {MemoryPolicy::kAuto, "auto"},         {MemoryPolicy::kSegments, "segments"},
      {MemoryPolicy::kFull, "full"},         {MemoryPolicy::kPerBlock, "per_block"},
      {MemoryPolicy::kDtr, "dtr"},           {MemoryPolicy::kDtrEq, "dtr_eq"},
      {MemoryPolicy::kMegEngine, "megengine"}, {MemoryPolicy::kLru, "lru"},
      {MemoryPolicy::kLargest, "largest"},   {MemoryPolicy::kSwap, "swap"},
      {MemoryPolicy::kHybrid, "hybrid"}};
};

// Anything but none: tensors may be dropped, so the policy needs a budget.
inline bool evicts(MemoryPolicy p) { return p != MemoryPolicy::kNone; }
// Static plans (memory/static_plan.h), with DTR as their safety net.
inline bool plans_statically(MemoryPolicy p) {
  return p == MemoryPolicy::kStatic || p == MemoryPolicy::kAuto || p == MemoryPolicy::kSegments;
}
// Every block's activations dropped at its end (MemoryOptions::checkpoint_blocks), DTR recomputing
// them in its backward; under per_block, but what the block's plan keeps (block_keep_bytes).
inline bool recomputes_blocks(MemoryPolicy p) { return p == MemoryPolicy::kFull || p == MemoryPolicy::kPerBlock; }
// Host swap (memory/host_swap.h), with DTR for what is not copied.
inline bool swaps(MemoryPolicy p) { return p == MemoryPolicy::kSwap || p == MemoryPolicy::kHybrid; }
// The host link open: host swap, or per_block plans that offload (memory.block_offload).
inline bool uses_host_link(MemoryPolicy p, bool block_offload) {
  return swaps(p) || (p == MemoryPolicy::kPerBlock && block_offload);
}
// The heuristic that chooses what DTR evicts under `p` (static plans and swap fall back on dtr);
// nullopt for none.
inline std::optional<EvictionHeuristic> eviction_heuristic(MemoryPolicy p) {
  switch (p) {
    case MemoryPolicy::kNone: return std::nullopt;
    case MemoryPolicy::kDtrEq: return EvictionHeuristic::kDtrEq;
    case MemoryPolicy::kMegEngine: return EvictionHeuristic::kMegEngine;
    case MemoryPolicy::kLru: return EvictionHeuristic::kLru;
    case MemoryPolicy::kLargest: return EvictionHeuristic::kLargest;
    default: return EvictionHeuristic::kDtr;
  }
}

// memory.compress: what backward keeps, smaller.
enum class Compression : uint8_t {
  kOff,
  kLossless,  // relu keeps a 1-bit mask instead of its output: the same bits
  kBf16,      // lossless, and fp32 activations cross the host link as bf16 (host swap only)
};
template <>
struct ChoiceNames<Compression> {
  static constexpr std::pair<Compression, const char*> table[] = {
      {Compression::kOff, "off"}, {Compression::kLossless, "lossless"}, {Compression::kBf16, "bf16"}};
};

// memory.optimizer_state: where the optimizer state waits between optimizer steps.
enum class StatePlace : uint8_t { kDevice, kHost };
template <>
struct ChoiceNames<StatePlace> {
  static constexpr std::pair<StatePlace, const char*> table[] = {{StatePlace::kDevice, "device"},
                                                                 {StatePlace::kHost, "host"}};
};

}  // namespace ht

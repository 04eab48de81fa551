#pragma once
// Sees every kernel the interpreter runs, forward and backward, as it begins and ends: what the
// planner's step recorder (planner/step_recorder.h) needs beside the allocations
// (AllocationObserver) to replay a step offline, and each tensor a policy evicts (what the replay
// is checked against). Called on the interpreter's thread.

namespace ht {

struct ComputePath;
struct TensorInfo;

class KernelObserver {
 public:
  virtual ~KernelObserver() = default;
  // Its inputs (forward) or saved values (backward) are resident and pinned.
  virtual void kernel_begins(const ComputePath& path, bool recompute, bool backward) = 0;
  virtual void kernel_ends(const ComputePath& path, bool recompute, bool backward) = 0;
  // A policy (not a static plan) dropped `t` to make room.
  virtual void evicted(const TensorInfo& t) {}
};

}  // namespace ht

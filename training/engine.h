#pragma once
// What one rank computes with: its model, the interpreter that runs it, the memory manager under
// the interpreter and the device memory it manages (a budget's arena, or none). Made first when a
// trainer is built; the trainer's parts (training/trainer_parts.h) are then made against it.

#include "alloc/cpu_arena.h"
#include "alloc/gradient_buffer.h"
#include "alloc/weight_copies.h"
#include "alloc/host_link.h"
#include "memory/memory_manager.h"
#include "models/model.h"
#include "runtime/interpreter.h"
#include "runtime/op_time_log.h"
#include "training/run_plan.h"

#include <memory>

namespace ht {

// The memory manager's options for `plan`'s policy and budget on `arena` (null: no budget):
// static plans, DTR's eviction, host swap over `link` (null: none), and "full" recomputation of
// the model's `blocks`.
MemoryOptions memory_options(const MemoryPlan& plan, uint64_t seed, std::shared_ptr<CpuArena> arena,
                             std::shared_ptr<HostLink> link, int blocks);

// Whether a tensor-parallel rank keeps its collectives' outputs (Interpreter::set_keep_collectives):
// under every memory policy but DTR with modelled costs.
bool keeps_collectives(const RunPlan& plan);

struct Engine {
  // `arena`: the device memory of plan.memory.budget_bytes, already active (ArenaScope); null for
  // unlimited memory. The interpreter is set as `plan` trains (autocast, relu masks, the seed);
  // the memory manager is configured by the trainer's parts.
  Engine(const RunPlan& plan, std::shared_ptr<Model> model, std::shared_ptr<CpuArena> arena);
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // The rank's device memory peak, host data excluded: with a budget the arena's (rounding
  // included), without one on the CPU what the job counts as device memory (DeviceMemoryScope),
  // on a GPU the caching allocator's bytes in tensors, not its cache nor cuBLAS's. -1: not measured.
  int64_t device_peak_bytes() const;
  void reset_device_peak();

  std::shared_ptr<Model> model;
  std::shared_ptr<CpuArena> arena;
  at::Device device;
  std::shared_ptr<HostLink> host_link;  // host swap's link; null without it
  // Where backward puts the parameters' gradients (Interpreter::set_gradient_buffer), kept here
  // for as long as the interpreter may write there: the gradients' block, laid out in the
  // all-reduce's order (under a budget, or with replicas whose gradients are whole), or ZeRO's
  // buckets (parallel/gradient_shards.h, which the gradient sync combines); null: the parameters'
  // own .grad().
  std::shared_ptr<GradientSlots> gradient_slots;
  // The whole gradients' block where gradient_slots is one; null otherwise.
  GradientBuffer* gradients = nullptr;
  // training.compute_weights = "kept": the weights' 16-bit copies the interpreter reads; null: casts.
  std::shared_ptr<ComputeWeights> weight_copies;
  MemoryManager memory;                 // before interp: it outlives the interpreter's records
  OpTimeLog op_times;                   // metrics.time_by_op: the interpreter's kernels
  Interpreter interp;
  // On a GPU without a budget: cuBLAS's workspaces, which the caching allocator counts and the
  // measured peak leaves out (make_cuda_library_workspaces).
  int64_t library_workspace_bytes = 0;
};

}  // namespace ht

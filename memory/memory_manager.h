#pragma once
// The per-rank memory manager (docs/design.md, docs/memory.md). It keeps exact accounting of
// the interpreter's non-leaf tensors and, given a budget, keeps device memory within it:
//  - the budget is a real capacity: an arena (cpu_arena.h) that ATen allocates from while an
//    ArenaScope is alive (cpu_device_allocator.h);
//  - before a kernel runs, it evicts by policy down to eviction_threshold of the budget;
//  - when an allocation still does not fit, the allocator asks make_room(), which evicts by
//    policy until the bytes are free, then, if the free memory is in pieces, evicts the tensor
//    whose block joins free neighbours into a block large enough (fragmentation);
//  - evicted tensors are regenerated on access by the interpreter (Rematerializer).
// Without eviction options it only accounts, and a full arena is an out-of-memory error.

#include "alloc/cpu_device_allocator.h"
#include "memory/eviction_policy.h"
#include "memory/host_swap.h"
#include "memory/kernel_observer.h"
#include "runtime/memory_hooks.h"
#include "alloc/out_of_memory.h"
#include "memory/static_plan.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

namespace ht {

class CpuArena;
class MemoryTimeline;

struct MemoryOptions {
  std::shared_ptr<CpuArena> arena;          // device memory of budget's size; null: unlimited
  std::optional<EvictionOptions> eviction;  // null: never evict
  double eviction_threshold = 0.9;          // before a kernel, evict down to this share of the budget
  MemoryTimeline* timeline = nullptr;       // memory trace; null: none
  // Static plans for steps that repeat (memory/static_plan.h), DTR (`eviction`) for the rest
  // and as their safety net; null: none. Needs a budget.
  std::optional<StaticPlanOptions> static_plans;
  // Host swap (memory/host_swap.h): copies to host memory, taken before recomputation; null:
  // none. Needs a budget and `eviction` (what is not swapped is recomputed).
  std::optional<SwapOptions> swap;

  // A budget of `arena`, evicting with `heuristic` (default options) or never.
  static MemoryOptions budget(std::shared_ptr<CpuArena> arena, std::optional<EvictionHeuristic> heuristic) {
    MemoryOptions m;
    m.arena = std::move(arena);
    if (heuristic) {
      m.eviction = EvictionOptions{};
      m.eviction->heuristic = *heuristic;
    }
    return m;
  }
};

struct MemoryStats {
  int64_t resident_bytes = 0;       // bytes of resident non-leaf storage now
  int64_t peak_resident_bytes = 0;  // since the last reset_peak()
  int64_t resident_tensors = 0;
  int64_t kernels = 0;              // kernels run, recomputations included
  int64_t recomputations = 0;       // kernels run to regenerate dropped data
  int64_t evictions = 0;            // tensors dropped by a policy to make room
  double recompute_ms = 0;          // time spent in those kernels
  // Fragmentation (1 - largest free block / free bytes) of the arena when its use was highest
  // since reset_peak(), sampled before each kernel.
  double fragmentation_at_peak = 0;
  // The largest (bytes that could not be evicted + bytes asked) seen when memory ran out:
  // no budget below it can work. 0 until memory ran out.
  int64_t min_budget_bytes = 0;
};

class MemoryManager final : public MemoryHooks, public OutOfMemoryHandler {
 public:
  // Given to an Interpreter when it is made (Interpreter's constructor), and outliving it:
  //   MemoryManager memory;
  //   Interpreter interp(options, &memory);
  MemoryManager() = default;
  ~MemoryManager() override;
  MemoryManager(const MemoryManager&) = delete;
  MemoryManager& operator=(const MemoryManager&) = delete;

  void bind(Rematerializer* interpreter) override;
  // After the interpreter is made, before its first kernel. The thread that calls it is the one that may evict.
  void configure(MemoryOptions options);
  const MemoryOptions& options() const { return options_; }
  CpuArena* arena() const { return options_.arena.get(); }
  // Whether anything reads kernels' measured times (ComputePath::kernel_ms()): eviction weighing
  // measured costs, host swap's copy-or-recompute choice, the step capture of static plans and
  // the planner's profile. On a GPU, kernels get CUDA events only then.
  bool reads_kernel_times() const override {
    return options_.static_plans.has_value() || options_.swap.has_value() ||
           (options_.eviction.has_value() && options_.eviction->costs == KernelCosts::kMeasured);
  }
  int64_t arena_in_use() const;  // 0 without a budget

  void before_kernel(const ComputePath& path, bool recompute) override;
  void after_kernel(const ComputePath& path, bool recompute, double kernel_ms) override;
  void before_backward(const ComputePath& path) override;
  void after_backward(const ComputePath& path) override;
  void forward_outputs(const ComputePath& path, const std::vector<Tensor>& outputs, bool taped) override;
  void backward_stage_begins(const ComputePath& path, const std::vector<const TensorInfo*>& saved) override;
  void backward_stage_ends(const ComputePath& path) override;
  void on_resident(TensorInfo& t) override;
  void on_dropped(TensorInfo& t) override;
  void on_destroyed(TensorInfo& t) override;
  bool make_room(size_t bytes) override;
  bool make_room_after(const OutOfBudget& failure) override;
  bool watches_backward_stages() const override { return planner_ != nullptr; }

  // Host swap (MemoryHooks says when the interpreter asks).
  bool swapping() const { return swap_ != nullptr; }
  bool comes_back_by_copy(const TensorInfo& t) const override { return swap_ && t.host != nullptr && !t.resident(); }
  at::Tensor swap_in(TensorInfo& t) override;
  bool prefetch(TensorInfo& t) override;
  int prefetch_lookahead() const override { return swap_ ? swap_->options().lookahead_entries : 0; }
  void release_host_copy(TensorInfo& t) override {
    if (swap_) swap_->release(t);
  }
  const SwapStats* swap_stats() const { return swap_ ? &swap_->stats() : nullptr; }

  // Under host swap, backward's gradients in flight are the last resort when memory runs out:
  // make_room parks the one read last on host before it gives up (a residual block's shortcut
  // gradient waits a whole branch).
  void gradient_pending(TensorInfo& t) override;
  at::Tensor take_gradient(TensorInfo& t) override;

  // Around one micro-batch's forward and backward (the trainer's): what static plans capture,
  // plan and run. Outside a step (evaluation, tests) no plan applies.
  void begin_step();
  // `completed`: forward and backward ran to their end (false: an exception left the step).
  void end_step(bool completed = true);
  // The model began block `block` (Model::set_block_listener): where segments may end.
  void block_begins(int block);
  // null without static plans.
  const StaticPlanner* static_planner() const { return planner_.get(); }

  const MemoryStats& stats() const { return stats_; }
  void reset_peak();
  void set_timeline(MemoryTimeline* timeline) {
    options_.timeline = timeline;
    if (swap_) swap_->set_timeline(timeline);
  }
  // Told of every kernel's start and end (the planner's profiled step); null: nobody.
  void set_kernel_observer(KernelObserver* observer) { kernel_observer_ = observer; }
  // Resident root tensors that own bytes: the candidates a policy chooses from.
  const std::vector<TensorInfo*>& candidates() const { return roots_; }
  Evictor* evictor() { return evictor_.get(); }  // null without eviction
  // Drop the data of every evictable resident tensor (tests use it to exercise regeneration).
  int64_t evict_all();

 private:
  void prepare(int64_t expected_bytes);
  // `planned`: a static plan drops it (counted by the planner, not as an eviction).
  void evict(TensorInfo& victim, bool planned = false);
  TensorInfo* pick_for_fragmentation(int64_t bytes);
  // The next tensor to drop for room: one with a host copy (free), else, after waiting for
  // copies to host still running, the eviction policy's choice (recomputed); null if none, or
  // if it gave back a prefetch's bytes instead (`*freed`).
  TensorInfo* next_victim(bool* freed);
  // Gathered parameters (sharded, runtime/parameter_source.h) compete with `victim` (may be null)
  // by the policy's score: drops the best of them if it scores lower. True if it dropped one.
  bool drop_parameters_before(TensorInfo* victim);
  void forget(TensorInfo& t);
  // Parks the pending gradient read last (memory/host_swap.h); false if none can go.
  bool park_a_gradient();

  Rematerializer* remat_ = nullptr;  // the interpreter it serves
  MemoryOptions options_;
  std::unique_ptr<Evictor> evictor_;
  std::unique_ptr<StaticPlanner> planner_;
  std::unique_ptr<HostSwap> swap_;
  bool prefetching_ = false;  // a prefetch allocates: make_room must not evict for it
  bool backward_seen_ = false;
  std::thread::id owner_ = std::this_thread::get_id();
  KernelObserver* kernel_observer_ = nullptr;
  bool making_room_ = false;
  int64_t fragmentation_sampled_at_ = -1;  // arena bytes in use when fragmentation_at_peak was taken
  MemoryStats stats_;
  std::vector<TensorInfo*> roots_;
  std::unordered_map<TensorInfo*, size_t> root_slot_;  // index in roots_
  std::vector<TensorInfo*> pending_grads_;  // host swap only: records with a gradient in flight
};

}  // namespace ht

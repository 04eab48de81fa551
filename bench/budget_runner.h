#pragma once
// Benchmark support: one model training in its own device memory (an arena of a given size),
// with or without eviction, one step at a time, so that two of them can be interleaved.

#include "bench/bench_util.h"
#include "training/state_offload.h"
#include "alloc/cpu_arena.h"
#include "alloc/cpu_device_allocator.h"
#include "memory/eviction_policy.h"
#include "memory/memory_manager.h"
#include "models/model.h"
#include "runtime/interpreter.h"

#include <torch/optim/sgd.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

namespace ht::bench {

// Where the runners train (bench --device): the CPU, whose arenas are mmap'd ranges, or a GPU,
// whose arenas are cudaMalloc blocks in front of ATen's caching allocator (alloc/cuda_arena.h).
at::Device& bench_device();
// An arena no run fills: 16 GiB of reserved address space on the CPU (not committed memory); on
// a GPU 45% of its free memory at the first call (two runners are alive at once).
int64_t unlimited_bytes();

struct Workload {
  std::string name;
  int64_t batch;  // the base batch
  std::function<std::shared_ptr<Model>()> make;
  std::function<std::pair<at::Tensor, at::Tensor>(int64_t batch)> data;  // (input, target)
  // The same model and batch for bench/peer/gpu_peer.py (PyTorch eager and checkpointing); empty:
  // the peer has no such model.
  std::string peer_args;
};
// ResNet-18 (small-input stem) on 32x32 images and a 6-layer GPT; --quick scales them down.
std::vector<Workload> workloads(bool quick);
// One larger model of each kind: ResNet-50 on 64x64 images and a 12-layer GPT.
std::vector<Workload> large_workloads(bool quick);
// What a GPU is measured on: ResNet-50 at 224x224 (ImageNet stem, 1000 classes) and a GPT the
// size of GPT-2 small (12 layers, d 768, 12 heads, T 1024, vocabulary 50257).
std::vector<Workload> gpu_workloads(bool quick);

struct StepSample {
  double ms = 0, recompute_ms = 0, loss = 0;
  int64_t evictions = 0, recomputations = 0, peak_in_use = 0;
  int64_t window_evictions = 0;  // of the evictions, those made by Coop's windows
  // 1 - largest free block / free bytes when the arena's use was highest (MemoryStats); without
  // host swap (whose peaks span steps) only.
  double fragmentation = 0;
  // Host swap in this step: bytes each way, bytes in that were back before their read, compute
  // waiting for copies, and the link's busy time each way.
  int64_t swap_out_bytes = 0, swap_in_bytes = 0, swap_in_hidden_bytes = 0;
  double swap_wait_ms = 0, link_busy_ms = 0;
  int64_t link_bytes = 0;
};

// The other memory savers: mixed precision, and gradient accumulation over equal micro-batches
// of the step's batch (the same global batch, one optimizer step).
struct Savers {
  std::optional<at::ScalarType> autocast;
  int64_t micro_batches = 1;
  // Static plans for the repeating step (memory/static_plan.h), DTR as their fallback.
  std::optional<StaticPlanOptions> static_plans;
  // With static_plans: the first step planned before it runs, from a trace on meta tensors with
  // the optimizer's state (memory.plan_first_step, launcher/planning/first_step_plan.h), as the
  // trainer does by default.
  bool plan_first_step = true;
  // What DTR weighs (memory.kernel_costs).
  KernelCosts kernel_costs = KernelCosts::kModeled;
  // Evict Coop's cheapest window when a request finds no block (EvictionOptions::window).
  bool eviction_window = EvictionOptions{}.window;
  // Host swap (memory/host_swap.h), DTR recomputing what is not swapped.
  std::optional<SwapOptions> swap;
  // memory.policy = "full": every block but the last dropped at its end (needs a policy).
  bool full_recompute = false;
  // With `swap`: the optimizer state waits on host between steps, over swap's link
  // (memory.optimizer_state = "host"; training/state_offload.h).
  bool optimizer_state_on_host = false;
};

struct Unoptimized {
  int64_t fixed_bytes = 0;  // parameters, their gradients, optimizer state
  int64_t peak_in_use = 0;  // the step's peak
  // fixed + ratio x activations: the DTR paper's ratio, with the fixed state inside the budget.
  int64_t budget_at(double ratio) const;
};

class BudgetRunner {
 public:
  // Throws OutOfBudget if even the model does not fit.
  BudgetRunner(const Workload& w, int64_t batch, int64_t budget, std::optional<EvictionHeuristic> policy,
               double eviction_threshold = MemoryOptions{}.eviction_threshold, const Savers& savers = {});
  ~BudgetRunner();
  // One SGD step on the runner's fixed batch. Throws OutOfBudget when the budget cannot hold it.
  StepSample step();
  // Measured over the steps so far (fixed: before the last one).
  Unoptimized unoptimized() const { return {fixed_bytes_, peak_in_use_}; }
  // null without static plans.
  const StaticPlanner* static_planner() const { return memory_->static_planner(); }

 private:
  void plan_first_step(const Workload& w, int64_t micro, const Savers& savers);

  std::shared_ptr<CpuArena> arena_;
  at::Device device_;
  std::shared_ptr<Model> model_;
  std::unique_ptr<torch::optim::SGD> sgd_;
  std::unique_ptr<GradientBuffer> gradients_;
  std::unique_ptr<MemoryManager> memory_;  // outlives interp_
  std::unique_ptr<Interpreter> interp_;
  std::unique_ptr<StateOffload> state_offload_;  // Savers::optimizer_state_on_host
  at::Tensor input_, target_;  // host
  int64_t micro_batches_ = 1;
  int64_t fixed_bytes_ = 0, peak_in_use_ = 0;
};

// Steps a and b alternately (A B, B A, ...) `reps` times, handing each pair to `pair`.
template <typename Pair>
void interleaved(BudgetRunner& a, BudgetRunner& b, int reps, Pair&& pair) {
  for (int i = 0; i < reps; ++i) {
    StepSample sa, sb;
    if (i % 2 == 0) {
      sa = a.step();
      sb = b.step();
    } else {
      sb = b.step();
      sa = a.step();
    }
    pair(sa, sb);
  }
}

}  // namespace ht::bench

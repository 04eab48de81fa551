#pragma once
// Test support: train a small model case for a few SGD steps with all of its device memory
// (parameters, gradients, optimizer state, batches, activations) in an arena of a given size,
// evicting with a given policy, and keep what a bit-identity check compares.

#include "memory/eviction_policy.h"
#include "memory/memory_manager.h"
#include "tests/support/model_cases.h"

#include <optional>
#include <vector>

namespace ht::test {

struct BudgetRun {
  bool out_of_budget = false;          // an allocation could not be served, even after evicting
  std::string failure;                 // what OutOfBudget said
  std::vector<at::Tensor> losses;      // per step (per micro-batch with accumulation)
  std::vector<at::Tensor> state;       // parameters then buffers after the last step
  std::vector<int64_t> in_use_after;   // arena bytes in use after each step
  int64_t peak_in_use = 0;             // arena peak over the run
  // What no policy can evict: the arena bytes in use before the last step (parameters, their
  // gradients' block, optimizer state).
  int64_t fixed_bytes = 0;
  MemoryStats stats;
  StaticPlanStats plan_stats;          // with static plans
  SwapStats swap_stats;                // with host swap
  int64_t live_records_after = 0;      // interpreter records alive after the last step
};

// The other memory savers, composed with the budget.
struct SaverOptions {
  std::optional<at::ScalarType> autocast;  // mixed precision: bf16 (or fp16)
  int64_t micro_batches = 1;               // gradient accumulation over equal slices of the batch
  // Static plans for the repeating step, with `heuristic` (DTR) as their fallback and safety net.
  std::optional<StaticPlanOptions> static_plans;
  // Host swap (swap or hybrid), with `heuristic` (DTR) recomputing what is not swapped.
  std::optional<SwapOptions> swap;
  // Where the model trains. On CUDA the arena is one cudaMalloc block (alloc/cuda_arena.h); what
  // the run keeps (losses, state) is copied to host memory, so the two devices compare alike.
  at::Device device = at::kCPU;
  // What eviction weighs (with `heuristic`): the default is EvictionOptions'.
  std::optional<KernelCosts> costs;
};

BudgetRun train_in_budget(const ModelCase& c, int64_t capacity, std::optional<EvictionHeuristic> heuristic,
                          int steps = 3, int64_t batch = 4, const SaverOptions& savers = {});

// ConvNet, ResNet-18, GPT with dropout and the supernet, deeper and wider than the gradient
// tests' cases: what every memory policy is tested on.
const std::vector<ModelCase>& budget_cases();

// `got` trained (no out-of-budget) to the same losses and parameters and buffers as `expected`,
// bit for bit (GoogleTest assertions).
void expect_identical(const BudgetRun& expected, const BudgetRun& got, const std::string& what);

// The budget that gives `ratio` of the unoptimized run's activation memory on top of its fixed
// state: fixed + ratio * (peak - fixed), the DTR paper's convention, with parameters, their
// gradients and optimizer state inside the budget.
int64_t budget_at(const BudgetRun& unoptimized, double ratio);

}  // namespace ht::test

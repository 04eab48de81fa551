#include "tests/support/budget_training.h"

#include "alloc/cpu_arena.h"
#include "alloc/cpu_device_allocator.h"
#include "alloc/cuda_arena.h"
#include "models/convnet.h"
#include "models/decoder.h"
#include "models/resnet.h"
#include "models/supernet.h"
#include "memory/memory_manager.h"
#include "runtime/interpreter.h"

#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

namespace ht::test {

BudgetRun train_in_budget(const ModelCase& c, int64_t capacity, std::optional<EvictionHeuristic> heuristic,
                          int steps, int64_t batch, const SaverOptions& savers) {
  constexpr uint64_t kSeed = 4;
  BudgetRun run;
  const bool gpu = savers.device.is_cuda();
  auto arena = gpu ? make_cuda_arena(capacity, savers.device.has_index() ? savers.device.index() : 0)
                   : std::make_shared<CpuArena>(capacity);
  std::optional<ArenaScope> cpu_memory;
  std::optional<CudaArenaScope> gpu_memory;
  if (gpu) {
    gpu_memory.emplace(arena);
  } else {
    cpu_memory.emplace(arena);
  }
  const auto to_host = at::TensorOptions().device(at::kCPU);
  MemoryManager memory;
  Interpreter interp(InterpreterOptions{ExecutionMode::kInterpreted, kSeed}, &memory);
  MemoryOptions options = MemoryOptions::budget(arena, heuristic);
  options.static_plans = savers.static_plans;
  options.swap = savers.swap;
  if (options.eviction && savers.costs) options.eviction->costs = *savers.costs;
  memory.configure(options);
  interp.set_autocast(savers.autocast);
  TORCH_CHECK(batch % savers.micro_batches == 0, "train_in_budget: batch ", batch, " in ", savers.micro_batches,
              " micro-batches");
  const int64_t micro = batch / savers.micro_batches;
  try {
    at::manual_seed(kSeed);
    std::shared_ptr<Model> model = c.make();
    if (gpu) model->move_to(savers.device, at::kFloat);
    model->set_block_listener([&memory](int block) { memory.block_begins(block); });
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    GradientBuffer gradients(model->parameters());
    interp.set_gradient_buffer(&gradients);
    for (int step = 0; step < steps; ++step) {
      run.fixed_bytes = arena->stats().in_use;  // the gradients' block included
      at::manual_seed(100 + step);
      auto [x, y] = c.data(batch);  // drawn on the host: the same batches on either device
      if (gpu) {
        x = x.to(savers.device);
        y = y.to(savers.device);
      }
      for (int64_t k = 0; k < savers.micro_batches; ++k) {
        memory.begin_step();
        Tensor loss = model->loss(model->forward(interp.input(x.narrow(0, k * micro, micro))),
                                  interp.input(y.narrow(0, k * micro, micro)));
        interp.backward({loss}, {at::full(loss.sizes(), 1.0 / static_cast<double>(savers.micro_batches),
                                          loss.options())});
        HostAllocationScope host;  // what the test keeps is not the model's memory
        run.losses.push_back(loss.value().to(to_host, false, /*copy=*/true));
        loss.reset();
        memory.end_step();
      }
      sgd.step();
      clear_grads(*model);
      run.in_use_after.push_back(arena->stats().in_use);
    }
    HostAllocationScope host;
    for (const at::Tensor& p : model->parameters()) run.state.push_back(p.detach().to(to_host, false, true));
    for (const at::Tensor& b : model->buffers()) run.state.push_back(b.to(to_host, false, true));
    run.live_records_after = interp.live_records();
  } catch (const OutOfBudget& e) {
    memory.end_step(/*completed=*/false);
    run.out_of_budget = true;
    run.failure = std::string(e.what()) + " (in step " + std::to_string(run.losses.size() + 1) + ")";
  }
  run.stats = memory.stats();
  if (const StaticPlanner* planner = memory.static_planner()) run.plan_stats = planner->stats();
  if (const SwapStats* swap = memory.swap_stats()) run.swap_stats = *swap;
  run.peak_in_use = arena->stats().peak_in_use;
  return run;
}

// Deeper and wider than the gradient tests' cases, at batches where activations dominate memory
// as in real training: with a few KiB of activations, one kernel's workspace or the optimizer
// state would decide every budget.
const std::vector<ModelCase>& budget_cases() {
  static const std::vector<ModelCase> cases = [] {
    auto images = [](int64_t c, int64_t size, int64_t classes) {
      return [=](int64_t b) { return std::make_pair(at::randn({b, c, size, size}), at::randint(classes, {b}, at::kLong)); };
    };
    std::vector<ModelCase> v;
    v.push_back({"convnet", [] { return std::make_shared<ConvNet>(ConvNetOptions{1, 16, {8, 16, 16}, 32, 5, 0.25}); },
                 images(1, 16, 5)});
    v.push_back({"resnet18", [] { return std::make_shared<ResNet>(ResNetOptions{18, 8, {}, 3, 5, true}); },
                 images(3, 16, 5)});
    v.push_back({"gpt", [] { return std::make_shared<Decoder>(DecoderOptions::gpt2(17, 32, 4, 2, 32, 0.1)); },
                 [](int64_t b) {
                   return std::make_pair(at::randint(17, {b, 32}, at::kLong), at::randint(17, {b, 32}, at::kLong));
                 }});
    v.push_back({"llama", [] { return std::make_shared<Decoder>(DecoderOptions::llama(19, 32, 4, 4, 2, 32)); },
                 [](int64_t b) {
                   return std::make_pair(at::randint(19, {b, 32}, at::kLong), at::randint(19, {b, 32}, at::kLong));
                 }});
    v.push_back({"supernet", [] { return std::make_shared<Supernet>(SupernetOptions{3, 16, 6, 16, 5}); },
                 images(3, 16, 5)});
    return v;
  }();
  return cases;
}

void expect_identical(const BudgetRun& expected, const BudgetRun& got, const std::string& what) {
  ASSERT_FALSE(got.out_of_budget) << what << ": " << got.failure;
  ASSERT_EQ(expected.losses.size(), got.losses.size()) << what;
  for (size_t i = 0; i < expected.losses.size(); ++i)
    EXPECT_TRUE(expected.losses[i].equal(got.losses[i])) << what << ": loss at step " << i;
  ASSERT_EQ(expected.state.size(), got.state.size()) << what;
  for (size_t i = 0; i < expected.state.size(); ++i)
    EXPECT_TRUE(expected.state[i].equal(got.state[i])) << what << ": parameter/buffer " << i;
}

int64_t budget_at(const BudgetRun& unoptimized, double ratio) {
  const double activations = static_cast<double>(unoptimized.peak_in_use - unoptimized.fixed_bytes);
  const auto bytes = unoptimized.fixed_bytes + static_cast<int64_t>(ratio * activations);
  return (bytes + 63) / 64 * 64;
}

}  // namespace ht::test

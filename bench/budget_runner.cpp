#include "bench/budget_runner.h"

#include "models/gpt.h"
#include "models/resnet.h"

#include <chrono>

namespace ht::bench {

std::vector<Workload> workloads(bool quick) {
  const int64_t s = quick ? 4 : 1;  // --quick: same shapes, scaled down, for a smoke run
  std::vector<Workload> w;
  {
    const int64_t batch = 16 / s, width = 64 / s;
    w.push_back({"resnet18 32x32 b" + std::to_string(batch), batch,
                 [=] { return std::make_shared<ResNet>(ResNetOptions{18, width, {}, 3, 10, true}); },
                 [](int64_t b) { return std::make_pair(at::randn({b, 3, 32, 32}), at::randint(10, {b}, at::kLong)); }});
  }
  {
    const int64_t batch = 8 / s, t = 128 / s, d = 256 / s;
    w.push_back({"gpt 6L d" + std::to_string(d) + " T" + std::to_string(t) + " b" + std::to_string(batch), batch,
                 [=] { return std::make_shared<Gpt>(GptOptions{256, t, 6, 8, d, 0.1}); },
                 [=](int64_t b) {
                   return std::make_pair(at::randint(256, {b, t}, at::kLong), at::randint(256, {b, t}, at::kLong));
                 }});
  }
  return w;
}

int64_t Unoptimized::budget_at(double ratio) const {
  const auto bytes = fixed_bytes + static_cast<int64_t>(ratio * static_cast<double>(peak_in_use - fixed_bytes));
  return (bytes + 63) / 64 * 64;
}

BudgetRunner::BudgetRunner(const Workload& w, int64_t batch, int64_t budget, std::optional<EvictionHeuristic> policy,
                           double eviction_threshold)
    : arena_(std::make_shared<CpuArena>(budget)) {
  at::manual_seed(0);
  std::tie(input_, target_) = w.data(batch);  // host memory: the data set's side
  ArenaScope device(arena_);
  model_ = w.make();
  model_->train();
  sgd_ = std::make_unique<torch::optim::SGD>(model_->parameters(), torch::optim::SGDOptions(1e-3).momentum(0.9));
  gradients_ = std::make_unique<GradientBuffer>(model_->parameters());
  interp_ = std::make_unique<Interpreter>(InterpreterOptions{ExecutionMode::kInterpreted, 1});
  interp_->set_gradient_buffer(gradients_.get());
  MemoryOptions options = MemoryOptions::budget(arena_, policy);
  options.eviction_threshold = eviction_threshold;
  interp_->memory().configure(options);
}

BudgetRunner::~BudgetRunner() {
  // Tensors go back to their arena whenever they are freed; the order only keeps handles from
  // outliving their interpreter.
  interp_.reset();
}

StepSample BudgetRunner::step() {
  ArenaScope device(arena_);
  // Parameters, their gradients' buffer, optimizer state.
  fixed_bytes_ = arena_->stats().in_use;
  arena_->reset_peak();
  const MemoryStats before = interp_->memory().stats();
  const auto t0 = std::chrono::steady_clock::now();
  {
    // The batch is copied into device memory, as a GPU run copies it from the host.
    Tensor loss = model_->loss(model_->forward(interp_->input(input_.clone())), interp_->input(target_.clone()));
    interp_->backward(loss);
    StepSample s;
    s.loss = loss.value().item<double>();
    loss.reset();
    sgd_->step();
    for (at::Tensor& p : model_->parameters()) p.mutable_grad() = at::Tensor();
    s.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const MemoryStats& after = interp_->memory().stats();
    s.recompute_ms = after.recompute_ms - before.recompute_ms;
    s.evictions = after.evictions - before.evictions;
    s.recomputations = after.recomputations - before.recomputations;
    s.peak_in_use = arena_->stats().peak_in_use;
    peak_in_use_ = std::max(peak_in_use_, s.peak_in_use);
    return s;
  }
}

}  // namespace ht::bench

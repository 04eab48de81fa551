#include "bench/budget_runner.h"
#include "training/fused_optimizer.h"

#include "launcher/planning/first_step_plan.h"
#include "alloc/cuda_arena.h"
#include "models/decoder.h"
#include "models/resnet.h"

#include <chrono>

namespace ht::bench {
namespace {

// The runner's arena made active for a while: ATen's CPU allocator or the CUDA one serves from it.
class DeviceMemory {
 public:
  DeviceMemory(const std::shared_ptr<CpuArena>& arena, const at::Device& device) {
    if (device.is_cuda()) {
      gpu_.emplace(arena);
    } else {
      cpu_.emplace(arena);
    }
  }

 private:
  std::optional<ArenaScope> cpu_;
  std::optional<CudaArenaScope> gpu_;
};

std::shared_ptr<CpuArena> make_arena(int64_t bytes, const at::Device& device) {
  if (!device.is_cuda()) return std::make_shared<CpuArena>(bytes);
  install_cuda_allocator();
  return make_cuda_arena(bytes, device.has_index() ? device.index() : 0);
}

}  // namespace

at::Device& bench_device() {
  static at::Device device(at::kCPU);
  return device;
}

int64_t unlimited_bytes() {
  static const int64_t bytes = [] {
    if (!bench_device().is_cuda()) return int64_t{16} << 30;
    const int64_t total = cuda_device_memory_bytes(bench_device().has_index() ? bench_device().index() : 0);
    TORCH_CHECK(total > 0, "unlimited_bytes: cannot read the GPU's memory");
    return (total * 45 / 100) / 64 * 64;
  }();
  return bytes;
}

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
                 [=] { return std::make_shared<Decoder>(DecoderOptions::gpt2(256, t, 6, 8, d, 0.1)); },
                 [=](int64_t b) {
                   return std::make_pair(at::randint(256, {b, t}, at::kLong), at::randint(256, {b, t}, at::kLong));
                 },
                 "--model gpt --layers 6 --heads 8 --vocab 256 --embd " + std::to_string(d) + " --seq " +
                     std::to_string(t) + " --batch " + std::to_string(batch)});
  }
  {
    // configs/llama_small.toml's shape (grouped-query attention, RoPE, RMSNorm, SwiGLU, untied)
    // at the GPT row's sequence and batch, over a SentencePiece-sized vocabulary.
    const int64_t batch = 8 / s, t = 128 / s, d = 256 / s, vocab = 4096 / s;
    w.push_back({"llama 6L d" + std::to_string(d) + " T" + std::to_string(t) + " b" + std::to_string(batch), batch,
                 [=] {
                   DecoderOptions o = DecoderOptions::llama(vocab, t, 6, 8, 4, d);
                   o.multiple_of = 64;
                   return std::make_shared<Decoder>(o);
                 },
                 [=](int64_t b) {
                   return std::make_pair(at::randint(vocab, {b, t}, at::kLong), at::randint(vocab, {b, t}, at::kLong));
                 }});
  }
  return w;
}

std::vector<Workload> gpu_workloads(bool quick) {
  const int64_t s = quick ? 4 : 1;
  std::vector<Workload> w;
  {
    const int64_t batch = 64 / s, size = 224 / s;
    w.push_back({"resnet50 " + std::to_string(size) + "x" + std::to_string(size) + " b" + std::to_string(batch), batch,
                 [] { return std::make_shared<ResNet>(ResNetOptions{50, 64, {}, 3, 1000, false}); },
                 [=](int64_t b) { return std::make_pair(at::randn({b, 3, size, size}), at::randint(1000, {b}, at::kLong)); },
                 "--model resnet50 --classes 1000 --batch " + std::to_string(batch) + " --size " + std::to_string(size)});
  }
  {
    const int64_t batch = 8 / s, t = 1024 / s, d = 768 / s, vocab = 50257;
    w.push_back({"gpt2-small T" + std::to_string(t) + " b" + std::to_string(batch), batch,
                 [=] { return std::make_shared<Decoder>(DecoderOptions::gpt2(vocab, t, 12, 12, d, 0.1)); },
                 [=](int64_t b) {
                   return std::make_pair(at::randint(vocab, {b, t}, at::kLong), at::randint(vocab, {b, t}, at::kLong));
                 },
                 "--model gpt --layers 12 --heads 12 --vocab " + std::to_string(vocab) + " --embd " + std::to_string(d) +
                     " --seq " + std::to_string(t) + " --batch " + std::to_string(batch)});
  }
  return w;
}

std::vector<Workload> large_workloads(bool quick) {
  const int64_t s = quick ? 4 : 1;
  std::vector<Workload> w;
  {
    const int64_t batch = 16 / s, width = 64 / s, size = 64 / s;
    w.push_back({"resnet50 " + std::to_string(size) + "x" + std::to_string(size) + " b" + std::to_string(batch), batch,
                 [=] { return std::make_shared<ResNet>(ResNetOptions{50, width, {}, 3, 10, false}); },
                 [=](int64_t b) { return std::make_pair(at::randn({b, 3, size, size}), at::randint(10, {b}, at::kLong)); }});
  }
  {
    const int64_t batch = 8 / s, t = 128 / s, d = 256 / s;
    w.push_back({"gpt 12L d" + std::to_string(d) + " T" + std::to_string(t) + " b" + std::to_string(batch), batch,
                 [=] { return std::make_shared<Decoder>(DecoderOptions::gpt2(256, t, 12, 8, d, 0.1)); },
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
                           double eviction_threshold, const Savers& savers)
    : arena_(make_arena(budget, bench_device())), device_(bench_device()), micro_batches_(savers.micro_batches) {
  TORCH_CHECK(batch % micro_batches_ == 0, "BudgetRunner: batch ", batch, " in ", micro_batches_, " micro-batches");
  at::manual_seed(0);
  std::tie(input_, target_) = w.data(batch);  // host memory: the data set's side
  if (device_.is_cuda()) {
    // Pinned, as the trainer stages a batch (training/dataset.h) and the peer holds its own: each
    // micro-batch's copy is then the copy engine's, queued without waiting.
    input_ = input_.pin_memory();
    target_ = target_.pin_memory();
  }
  DeviceMemory device(arena_, device_);
  model_ = w.make();
  if (device_.is_cuda()) model_->move_to(device_, at::kFloat);
  model_->train();
  // The trainer's SGD (training/fused_optimizer.h): on the CPU one pass per parameter, bit for bit
  // torch::optim's; on a GPU ATen's multi-tensor kernel, as the peer's torch.optim.SGD runs
  // multi-tensor kernels.
  sgd_ = std::make_unique<FusedSgd>(model_->parameters(), torch::optim::SGDOptions(1e-3).momentum(0.9));
  gradients_ = std::make_unique<GradientBuffer>(model_->parameters());
  memory_ = std::make_unique<MemoryManager>();
  interp_ = std::make_unique<Interpreter>(InterpreterOptions{ExecutionMode::kInterpreted, 1}, memory_.get());
  interp_->set_gradient_buffer(gradients_.get());
  interp_->set_autocast(savers.autocast);
  MemoryOptions options = MemoryOptions::budget(arena_, policy);
  options.eviction_threshold = eviction_threshold;
  options.static_plans = savers.static_plans;
  options.swap = savers.swap;
  if (savers.full_recompute) options.checkpoint_blocks = static_cast<int>(model_->blocks().size());
  if (options.eviction) options.eviction->costs = savers.kernel_costs;
  if (options.eviction) options.eviction->window = savers.eviction_window;
  TORCH_CHECK(!savers.optimizer_state_on_host || savers.swap, "BudgetRunner: the optimizer state on host needs swap's link");
  if (savers.optimizer_state_on_host) state_offload_ = std::make_unique<StateOffload>(savers.swap->link);
  memory_->configure(options);
  if (savers.static_plans || savers.full_recompute) {
    model_->set_block_listener([this](int block) { memory_->block_begins(block); });
  }
  if (savers.static_plans && savers.plan_first_step && !device_.is_cuda()) plan_first_step(w, batch / micro_batches_, savers);
}

// The runner's micro-batch traced on meta tensors, with its SGD's momentum, and planned (the
// trainer's memory.plan_first_step). On a GPU the trace's workspaces are not declared: not done.
void BudgetRunner::plan_first_step(const Workload& w, int64_t micro, const Savers& savers) {
  ht::Config c;
  c.training.optimizer = OptimizerKind::kSgd;
  c.training.momentum = 0.9;  // the runner's SGD: its state is a momentum buffer per parameter
  c.training.mixed_precision = !savers.autocast                      ? MixedPrecision::kOff
                               : *savers.autocast == at::kBFloat16 ? MixedPrecision::kBf16
                                                                   : MixedPrecision::kFp16;
  c.job.seed = 1;  // the runner's interpreter's
  const auto meta = [&](const at::Tensor& t) { return at::empty(t.sizes(), t.options().device(at::kMeta)); };
  const auto batch = [&] {
    return std::make_pair(meta(input_.narrow(0, 0, micro)), meta(target_.narrow(0, 0, micro)));
  };
  const CapturedStep step = trace_step_for_plan(c, w.make, batch, !savers.optimizer_state_on_host);
  memory_->static_planner()->plan_ahead(step);
}

BudgetRunner::~BudgetRunner() {
  // Tensors go back to their arena whenever they are freed; the order only keeps handles from
  // outliving their interpreter.
  interp_.reset();
}

StepSample BudgetRunner::step() {
  DeviceMemory device(arena_, device_);
  // Parameters, their gradients' buffer, optimizer state.
  fixed_bytes_ = arena_->stats().in_use;
  arena_->reset_peak();
  if (!memory_->swapping()) memory_->reset_peak();
  const MemoryStats before = memory_->stats();
  const SwapStats swap_before = memory_->swap_stats() ? *memory_->swap_stats() : SwapStats{};
  const HostLink* link = memory_->swapping() ? memory_->options().swap->link.get() : nullptr;
  LinkStats out_before, in_before;
  if (link != nullptr) {
    out_before = link->stats(CopyDirection::kToHost);
    in_before = link->stats(CopyDirection::kToDevice);
  }
  const auto t0 = std::chrono::steady_clock::now();
  {
    StepSample s;
    const int64_t micro = input_.size(0) / micro_batches_;
    // The micro-batches' losses summed where they are, read once the step is over (the trainer's
    // step reads its loss once its update is queued): no micro-batch waits for the device.
    std::vector<at::Tensor> losses;
    for (int64_t k = 0; k < micro_batches_; ++k) {
      // Each micro-batch is copied into device memory, as a GPU run copies it from the host
      // (non_blocking: from pinned memory on a GPU; on the CPU a copy like any other).
      memory_->begin_step();
      const auto on_device = at::TensorOptions().device(device_);
      const bool queued = device_.is_cuda();
      Tensor loss = model_->loss(model_->forward(interp_->input(input_.narrow(0, k * micro, micro).to(on_device, queued, true))),
                                 interp_->input(target_.narrow(0, k * micro, micro).to(on_device, queued, true)));
      const double scale = 1.0 / static_cast<double>(micro_batches_);
      interp_->backward({loss}, {at::full(loss.sizes(), scale, loss.options())});
      {
        const HostAllocationScope host(device_.is_cpu());  // no block in a CPU arena for it
        losses.push_back(loss.value().detach().to(at::kDouble));
      }
      loss.reset();
      memory_->end_step();
    }
    const std::vector<at::Tensor> params = model_->parameters();
    if (state_offload_) state_offload_->to_device(*sgd_, params, at::kCPU);
    sgd_->step();
    for (at::Tensor& p : model_->parameters()) p.mutable_grad() = at::Tensor();
    if (state_offload_) state_offload_->to_host(*sgd_, params);
    // On a GPU the step is over when its kernels are: reading one value waits for the stream.
    if (device_.is_cuda()) params.front().view(-1).slice(0, 0, 1).item<float>();
    for (const at::Tensor& loss : losses) s.loss += loss.item<double>() * (1.0 / static_cast<double>(micro_batches_));
    losses.clear();
    s.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const MemoryStats& after = memory_->stats();
    s.recompute_ms = after.recompute_ms - before.recompute_ms;
    s.evictions = after.evictions - before.evictions;
    s.window_evictions = after.window_evictions - before.window_evictions;
    s.fragmentation = after.fragmentation_at_peak;
    s.recomputations = after.recomputations - before.recomputations;
    s.peak_in_use = arena_->stats().peak_in_use;
    peak_in_use_ = std::max(peak_in_use_, s.peak_in_use);
    if (const SwapStats* swap = memory_->swap_stats()) {
      s.swap_out_bytes = swap->bytes_out - swap_before.bytes_out;
      s.swap_in_bytes = swap->bytes_in - swap_before.bytes_in;
      s.swap_in_hidden_bytes = swap->bytes_in_hidden - swap_before.bytes_in_hidden;
      s.swap_wait_ms = swap->wait_ms - swap_before.wait_ms;
      // Copies still running at the step's end count in the next step.
      const LinkStats out = link->stats(CopyDirection::kToHost), in = link->stats(CopyDirection::kToDevice);
      s.link_busy_ms = out.busy_ms - out_before.busy_ms + in.busy_ms - in_before.busy_ms;
      s.link_bytes = out.bytes - out_before.bytes + in.bytes - in_before.bytes;
    }
    return s;
  }
}

}  // namespace ht::bench

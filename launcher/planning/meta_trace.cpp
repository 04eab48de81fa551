#include "launcher/planning/meta_trace.h"

#include "base/compat.h"
#include "runtime/traced_device.h"
#include "base/clock.h"

#include "launcher/config/run_plan_of.h"

#include "launcher/model_factory.h"
#include "launcher/planning/profile_parts.h"
#include "training/fused_optimizer.h"
#include "training/optimizer.h"
#include "base/user_error.h"
#include "alloc/cpu_arena.h"
#include "alloc/cpu_device_allocator.h"
#include "alloc/meta_arena.h"
#include "memory/memory_manager.h"
#include "models/layers.h"
#include "parallel/communicator.h"
#include "parallel/tensor_group.h"
#include "planner/step_recorder.h"
#include "runtime/interpreter.h"
#include "runtime/mixed_precision.h"

#include <algorithm>
#include <chrono>
#include <optional>

namespace ht {

std::pair<at::Tensor, at::Tensor> traced_batch(const DataInfo& info, int64_t micro, bool meta, int64_t context) {
  std::vector<int64_t> shape{micro};
  for (int64_t s : info.sample_shape) shape.push_back(s);
  const bool tokens = info.task == Task::kLanguageModel;
  if (tokens && shape.size() > 1) shape[1] /= context;  // rank 0's chunks of each sequence
  const std::vector<int64_t> target_shape = tokens ? shape : std::vector<int64_t>{micro};
  if (meta) {
    const at::TensorOptions on_meta = at::TensorOptions().device(at::kMeta);
    return {at::empty(shape, on_meta.dtype(tokens ? at::kLong : at::kFloat)), at::empty(target_shape, on_meta.dtype(at::kLong))};
  }
  return {tokens ? at::randint(info.classes, shape, at::kLong) : at::randn(shape),
          at::randint(info.classes, target_shape, at::kLong)};
}

void trace_forward_backward(const Config& config, Model& model, const std::shared_ptr<CpuArena>& arena_ptr,
                            const at::Tensor& x, const at::Tensor& y, TracedStep& out, TraceExtras* extras) {
  CpuArena& arena = *arena_ptr;
  MemoryManager memory;
  Interpreter interp(InterpreterOptions{ExecutionMode::kInterpreted, static_cast<uint64_t>(config.job.seed)}, &memory);
  if (extras != nullptr) interp.set_seed_counter(extras->seed_counter);
  if (extras != nullptr && extras->capture_graph) {  // recorded as the profiler's steps are: nothing planned
    MemoryOptions options;
    StaticPlanOptions capture;
    capture.capture_only = true;
    capture.static_layout = false;
    options.static_plans = capture;
    options.arena = arena_ptr;  // the arena steps run in; its capacity is no budget here
    memory.configure(std::move(options));
  }
  interp.set_autocast(autocast_type(config.training.mixed_precision));
  BackwardReads reads;
  if (extras != nullptr) {
    interp.set_gradient_buffer(extras->gradients);
    if (extras->bucket_of != nullptr) {
      interp.set_parameter_source(&reads);
      interp.set_compute_weights(&reads);
    }
  }
  // A tensor-parallel rank's part, its group mirrored as the profiler mirrors it: on meta
  // tensors the collectives move nothing, and every buffer they fill is allocated as on data.
  std::optional<TensorGroup> group;
  if (config.parallel.tensor_parallel > 1) {
    group.emplace(std::make_shared<MirrorCommunicator>(static_cast<int>(config.parallel.tensor_parallel)));
    interp.set_tensor_parallel(&*group);
  }
  std::optional<TensorGroup> context;  // a context-parallel rank's chunks, its group mirrored alike
  if (config.parallel.context_parallel > 1) {
    context.emplace(std::make_shared<MirrorCommunicator>(static_cast<int>(config.parallel.context_parallel)));
    interp.set_context_parallel(&*context);
  }
  arena.reset_peak();
  const int64_t before = arena.stats().in_use;
  StepRecorder recorder(memory, before);
  if (extras != nullptr && extras->bucket_of != nullptr) recorder.set_gradient_buckets(*extras->bucket_of);
  model.set_block_listener([&](int block) {
    recorder.enter_block(block);
    memory.block_begins(block);
    reads.in_backward = block < 0;
  });
  const bool capture = extras != nullptr && extras->capture_graph;
  if (capture) memory.begin_step();
  {
    Tensor loss = model.loss(model.forward(interp.input(x)), interp.input(y));
    interp.backward(loss);
  }
  if (capture) memory.end_step();
  model.set_block_listener(nullptr);
  interp.set_parameter_source(nullptr);
  interp.set_compute_weights(nullptr);
  out.trace = recorder.take();
  out.step_peak_bytes = arena.stats().peak_in_use - before;
  if (extras == nullptr) return;
  extras->seed_counter = interp.seed_counter();
  if (extras->bucket_of != nullptr) {
    extras->backward_read_buckets = buckets_read(reads.read, *extras->bucket_of);
    extras->backward_copy_buckets = buckets_read(reads.copies_saved(), *extras->bucket_of);
    extras->backward_fp32_buckets = buckets_read(reads.saved, *extras->bucket_of);
    precision_reads(reads, *extras->bucket_of, extras->half_read_buckets, extras->fp32_read_elements);
  }
  if (const CapturedStep* step = extras->capture_graph ? memory.static_planner()->last_step() : nullptr) {
    extras->graph = step->graph;
    extras->block_starts = step->block_starts;
    extras->signatures = step->signatures;
    extras->sequence_hash = step->sequence_hash;
  }
}

bool steps_fused_here(const Config& config) {
  const bool kernel =
      config.training.optimizer == OptimizerKind::kAdamw ? compat::kFusedAdamWOnCuda : compat::kFusedSgdOnCuda;
  return at::Device(config.training.device).is_cpu() || (kernel && fused_on_gpu(config.training));
}

void trace_optimizer_step(const Config& config, Model& model, CpuArena& arena, TracedStep& out, bool fused_pass) {
  const std::unique_ptr<torch::optim::Optimizer> optimizer = make_optimizer(optimizer_options_of(config.training), model.parameters());
  if (auto* fused = dynamic_cast<FusedStep*>(optimizer.get())) fused->set_meta_as_fused(fused_pass);
  // What the trainer's step holds beside the update (training/optimizer.cpp, optimizer_step): each
  // gradient's norm, their stack and its norm, freed before the update, which (fused) allocates
  // nothing but its state. (A CPU rank keeps the norm and the clipping coefficient outside its
  // arena; a GPU holds them through the update: two 0-dim blocks this trace leaves out.)
  const auto step = [&] {
    {
      const at::Tensor norms = gradient_norms(model.parameters());
      if (norms.numel() > 0) const at::Tensor total = norms.norm();
    }
    optimizer->step();
  };
  arena.reset_peak();
  const int64_t before = arena.stats().in_use;
  step();
  out.optimizer_state_bytes = arena.stats().in_use - before;
  int64_t working = arena.stats().peak_in_use - before - out.optimizer_state_bytes;
  // Every later step: the state exists, its temporaries are placed among it differently (AdamW's
  // second step of a small Llama needs twice its first's).
  arena.reset_peak();
  const int64_t again = arena.stats().in_use;
  step();
  working = std::max(working, arena.stats().peak_in_use - again);
  out.optimizer_peak_bytes = out.optimizer_state_bytes + working;
}

TracedStep trace_micro_batch(const Config& config, const DataInfo& info, int64_t micro_batch, bool meta,
                             int64_t capacity) {
  const auto start = std::chrono::steady_clock::now();
  // Meta: address space only. Data (the comparison's run): pages reserved, committed as touched.
  const std::shared_ptr<CpuArena> arena =
      meta ? make_meta_arena(capacity) : std::make_shared<CpuArena>(std::min(capacity, int64_t{1} << 36));
  std::optional<MetaArenaScope> meta_scope;
  std::optional<ArenaScope> data_scope;
  const TracedForGpu traced_for(TracedForGpu::current() || (meta && at::Device(config.training.device).is_cuda()));
  if (meta) {
    meta_scope.emplace(arena);
  } else {
    data_scope.emplace(arena);
  }
  TracedStep out;
  std::shared_ptr<Model> model;
  {
    std::optional<MetaParametersScope> on_meta;
    if (meta) on_meta.emplace();
    at::manual_seed(config.job.seed);
    model = make_model(config, info, /*tensor_rank=*/0);
    if (config.training.channels_last) model->use_channels_last();  // as the job lays it out
  }
  for (const at::Tensor& p : model->parameters()) out.parameters += p.numel();
  out.model_bytes = arena->stats().in_use;
  const auto [x, y] = traced_batch(info, micro_batch, meta, config.parallel.context_parallel);
  trace_forward_backward(config, *model, arena, x, y, out);
  trace_optimizer_step(config, *model, *arena, out, steps_fused_here(config));
  model.reset();
  out.seconds = seconds_since(start);
  return out;
}

}  // namespace ht

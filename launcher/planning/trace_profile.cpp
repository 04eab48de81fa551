#include "launcher/planning/trace_profile.h"

#include "launcher/model_factory.h"
#include "launcher/planning/meta_trace.h"
#include "launcher/planning/profile_parts.h"
#include "alloc/gradient_buffer.h"
#include "alloc/meta_arena.h"
#include "models/layers.h"
#include "parallel/communicator.h"
#include "parallel/data_parallel.h"
#include "planner/cost_model.h"

#include <algorithm>
#include <chrono>

namespace ht {
namespace {

// The model's own figures: parameters, their bytes per block, the buckets sharding splits.
void describe_model(const Config& config, const Model& model, ModelProfile& profile) {
  for (const at::Tensor& p : model.parameters()) profile.parameters += p.numel();
  profile.parameter_bytes = arena_tensor_bytes(model.parameters()) + arena_tensor_bytes(model.buffers());
  for (const auto& block : model.blocks()) profile.block_parameter_bytes.push_back(arena_tensor_bytes(block->parameters()));
  profile.buckets = DataParallel(std::make_shared<LocalCommunicator>(), model.parameters(), config.parallel.bucket_mb << 20)
                        .bucket_elements();
}

// One traced micro-batch as a profiled point: its memory from the trace, its time priced.
ProfilePoint traced_point(const TracedStep& step, TraceExtras& extras, const ModelProfile& profile,
                          int64_t micro, MixedPrecision precision, const TraceRequest& request,
                          double optimizer_ms) {
  ProfilePoint point;
  point.micro_batch = micro;
  point.precision = precision;
  point.threads = 1;
  point.trace = step.trace;
  point.blocks.assign(profile.block_parameter_bytes.size(), BlockTime{});
  for (TraceKernel& k : point.trace.kernels) {
    k.ms = kernel_ms(k, request.rates);
    point.forward_backward_ms += k.ms;
    if (k.block < 0) continue;
    BlockTime& b = point.blocks[static_cast<size_t>(k.block)];
    (k.backward ? b.backward_ms : b.forward_ms) += k.ms;
  }
  point.optimizer_ms = optimizer_ms;
  point.step_ms = point.forward_backward_ms + optimizer_ms;
  point.persistent_bytes = profile.parameter_bytes + profile.gradient_bytes + profile.optimizer_state_bytes;
  point.batch_bytes = batch_bytes(profile, micro);
  point.forward_backward_peak_bytes = point.persistent_bytes + point.batch_bytes + step.step_peak_bytes;
  point.optimizer_peak_bytes = point.persistent_bytes + point.batch_bytes +
                               std::max<int64_t>(0, step.optimizer_peak_bytes - step.optimizer_state_bytes);
  point.peak_bytes = std::max(point.forward_backward_peak_bytes, point.optimizer_peak_bytes);
  point.backward_read_buckets = std::move(extras.backward_read_buckets);
  point.graph = std::move(extras.graph);
  point.block_starts = std::move(extras.block_starts);
  return point;
}

// What the profile knows of the job before anything is traced.
ModelProfile job_figures(const Config& config, const DataInfo& info, const TraceRequest& request) {
  ModelProfile profile;
  profile.model = choice_name(config.model.name);
  profile.optimizer = choice_name(config.training.optimizer);
  profile.global_batch = config.training.global_batch_size;
  profile.train_samples = request.train_samples;
  if (info.task == Task::kLanguageModel && !info.sample_shape.empty()) profile.tokens_per_sample = info.sample_shape[0];
  profile.steps_per_epoch = std::max<int64_t>(1, request.train_samples / std::max<int64_t>(1, profile.global_batch));
  profile.threads = 1;
  profile.how = "traced on meta tensors, priced at the device's rates";
  profile.tensor_parallel = static_cast<int>(config.parallel.tensor_parallel);
  profile.sequence_parallel = profile.tensor_parallel > 1 && config.parallel.sequence_parallel;
  if (is_decoder(config.model.name)) {
    DecoderOptions o = decoder_options(config.model, info.classes);
    o.tensor_parallel = config.parallel.tensor_parallel;
    profile.tensor_shape = tensor_shape(o);
  }
  {
    const auto [x, y] = traced_batch(info, 1, /*meta=*/true);
    profile.input_sample_bytes = static_cast<int64_t>(x.nbytes());
    profile.target_sample_bytes = static_cast<int64_t>(y.nbytes());
  }
  return profile;
}

}  // namespace

ModelProfile trace_profile(const Config& config, const DataInfo& info, const TraceRequest& request) {
  const auto start = std::chrono::steady_clock::now();
  ModelProfile profile = job_figures(config, info, request);
  const std::shared_ptr<CpuArena> arena = make_meta_arena(int64_t{1} << 45);
  MetaArenaScope scope(arena);
  std::shared_ptr<Model> model;
  {
    MetaParametersScope on_meta;
    at::manual_seed(config.job.seed);
    model = make_model(config, info, /*tensor_rank=*/0);
  }
  describe_model(config, *model, profile);
  const std::unordered_map<const c10::TensorImpl*, size_t> bucket_of =
      record_block_buckets(*model, config.parallel.bucket_mb << 20, profile);
  // The trainer's gradient block, in data parallelism's reduction order (launcher/training/trainer.cpp).
  const int64_t before_gradients = arena->stats().in_use;
  const GradientBuffer gradients(DataParallel(std::make_shared<LocalCommunicator>(), model->parameters(),
                                              config.parallel.bucket_mb << 20).reduction_order());
  profile.gradient_bytes = arena->stats().in_use - before_gradients;
  const double optimizer_ms =
      optimizer_step_ms(profile.parameters, static_cast<int64_t>(model->parameters().size()),
                        config.training.optimizer == OptimizerKind::kAdamw, config.training.grad_clip > 0, request.rates);
  TracedStep first_optimizer;
  bool stepped = false;
  for (MixedPrecision precision : request.precisions) {
    Config c = config;
    c.training.mixed_precision = precision;
    for (int64_t micro : request.micro_batches) {
      TracedStep step;
      TraceExtras extras;
      extras.gradients = &gradients;
      extras.bucket_of = &bucket_of;
      extras.capture_graph = true;
      {
        const auto [x, y] = traced_batch(info, micro, /*meta=*/true);
        trace_forward_backward(c, *model, arena, x, y, step, &extras);
      }
      if (!stepped) {  // the state once: it is the same at every size and precision
        trace_optimizer_step(c, *model, *arena, first_optimizer);
        profile.optimizer_state_bytes = first_optimizer.optimizer_state_bytes;
        stepped = true;
      }
      step.optimizer_state_bytes = first_optimizer.optimizer_state_bytes;
      step.optimizer_peak_bytes = first_optimizer.optimizer_peak_bytes;
      profile.points.push_back(traced_point(step, extras, profile, micro, precision, request, optimizer_ms));
      const bool two = profile.points.size() >= 2 && profile.points[profile.points.size() - 2].precision == precision;
      if (request.device_memory > 0 && two && profile.points.back().activation_bytes() > request.device_memory) break;
    }
  }
  profile.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return profile;
}

}  // namespace ht

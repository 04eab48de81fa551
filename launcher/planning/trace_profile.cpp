#include "launcher/planning/trace_profile.h"
#include "base/clock.h"

#include "launcher/model_factory.h"
#include "launcher/planning/layer_traces.h"
#include "launcher/planning/meta_trace.h"
#include "launcher/planning/profile_parts.h"
#include "alloc/gradient_buffer.h"
#include "alloc/meta_arena.h"
#include "models/layers.h"
#include "parallel/communicator.h"
#include "runtime/traced_device.h"
#include "parallel/data_parallel.h"
#include "planner/cost_model.h"
#include "planner/pipeline_terms.h"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace ht {
namespace {

// One traced micro-batch as a profiled point: its memory from the trace, its time priced.
ProfilePoint traced_point(const TracedStep& step, TraceExtras& extras, const ModelProfile& profile,
                          int64_t micro, MixedPrecision precision, const TraceRequest& request,
                          double optimizer_ms) {
  ProfilePoint point;
  point.micro_batch = micro;
  point.precision = precision;
  point.threads = 1;
  point.trace = step.trace;
  for (TraceKernel& k : point.trace.kernels) {
    k.ms = kernel_ms(k, request.rates);
    point.forward_backward_ms += k.ms;
  }
  point.blocks = block_times(point.trace, profile.block_parameter_bytes.size());
  point.optimizer_ms = optimizer_ms;
  point.step_ms = point.forward_backward_ms + optimizer_ms;
  point.persistent_bytes = profile.parameter_bytes + profile.gradient_bytes + profile.optimizer_state_bytes;
  point.batch_bytes = batch_bytes(profile, micro);
  point.forward_backward_peak_bytes = point.persistent_bytes + point.batch_bytes + step.step_peak_bytes;
  point.optimizer_peak_bytes = point.persistent_bytes + point.batch_bytes +
                               std::max<int64_t>(0, step.optimizer_peak_bytes - step.optimizer_state_bytes);
  point.peak_bytes = std::max(point.forward_backward_peak_bytes, point.optimizer_peak_bytes);
  point.backward_read_buckets = std::move(extras.backward_read_buckets);
  point.half_read_buckets = std::move(extras.half_read_buckets);
  point.backward_copy_buckets = std::move(extras.backward_copy_buckets);
  point.backward_fp32_buckets = std::move(extras.backward_fp32_buckets);
  point.fp32_read_elements = std::move(extras.fp32_read_elements);
  point.graph = std::move(extras.graph);
  point.block_starts = std::move(extras.block_starts);
  set_stage_terms(point);
  return point;
}

// What the profile knows of the job before anything is traced.
ModelProfile job_figures(const Config& config, const DataInfo& info, const TraceRequest& request) {
  ModelProfile profile = job_profile(config, info, request.train_samples);
  profile.threads = 1;
  profile.how = "traced on meta tensors, priced at the device's rates";
  profile.times_measured = false;
  {
    const auto [x, y] = traced_batch(info, 1, /*meta=*/true, config.parallel.context_parallel);
    profile.input_sample_bytes = static_cast<int64_t>(x.nbytes());
    profile.target_sample_bytes = static_cast<int64_t>(y.nbytes());
  }
  return profile;
}

// Two traces of the same step at two micro-batch sizes: the same kernels and tensors in the same
// order, their sizes apart.
bool same_shape(const StepTrace& a, const StepTrace& b) {
  return a.tensors.size() == b.tensors.size() && a.kernels.size() == b.kernels.size() && a.events.size() == b.events.size();
}

// The point at micro-batch `m` derived from two traced ones, not traced again: every tensor's
// bytes and every kernel's work are affine in the micro-batch (a weight's part constant, an
// activation's proportional), so they are the line through the two traces, exactly but for the
// arena's 64-byte rounding; each kernel is then priced at its own size. The static plans' graph
// is not derived (the search for a catalog device plans no static plans).
ProfilePoint derived_point(const ProfilePoint& a, const ProfilePoint& b, int64_t m, const DeviceRates& rates) {
  const double t = static_cast<double>(m - a.micro_batch) / static_cast<double>(b.micro_batch - a.micro_batch);
  auto line = [&](double ya, double yb) { return ya + t * (yb - ya); };
  auto bytes = [&](int64_t ya, int64_t yb) {
    return std::max<int64_t>(arena_bytes(0), arena_bytes(static_cast<int64_t>(std::llround(line(static_cast<double>(ya),
                                                                                                 static_cast<double>(yb))))));
  };
  ProfilePoint p = b;
  p.micro_batch = m;
  p.graph = {};
  p.block_starts.clear();
  for (size_t i = 0; i < p.trace.tensors.size(); ++i) p.trace.tensors[i].bytes = bytes(a.trace.tensors[i].bytes, b.trace.tensors[i].bytes);
  p.forward_backward_ms = 0;
  for (size_t k = 0; k < p.trace.kernels.size(); ++k) {
    TraceKernel& kernel = p.trace.kernels[k];
    kernel.flops = line(a.trace.kernels[k].flops, kernel.flops);
    kernel.bytes = line(a.trace.kernels[k].bytes, kernel.bytes);
    kernel.ms = kernel_ms(kernel, rates);
    p.forward_backward_ms += kernel.ms;
  }
  p.blocks = block_times(p.trace, p.blocks.size());
  p.step_ms = p.forward_backward_ms + p.optimizer_ms;
  p.batch_bytes = bytes(a.batch_bytes, b.batch_bytes);
  p.forward_backward_peak_bytes = bytes(a.forward_backward_peak_bytes, b.forward_backward_peak_bytes);
  p.optimizer_peak_bytes = p.persistent_bytes + p.batch_bytes + b.optimizer_working_bytes();
  p.peak_bytes = std::max(p.forward_backward_peak_bytes, p.optimizer_peak_bytes);
  set_stage_terms(p);
  return p;
}

// One micro-batch traced, with its extras. A graph that changes every step (the supernet's
// sampled path) is traced for its first kPaths steps, drawn as the trainer draws them, and the
// step of the highest peak kept, as the profiler keeps the highest of the steps it measures: a
// plan must fit every step's path. Its kernels, so its time, are that path's (the heaviest).
constexpr int kPaths = 16;

TracedStep traced_step(const Config& c, Model& model, const std::shared_ptr<CpuArena>& arena, const DataInfo& info,
                       int64_t micro, const GradientSlots* gradients,
                       const std::unordered_map<const c10::TensorImpl*, size_t>* bucket_of, TraceExtras& kept) {
  TracedStep best;
  uint64_t counter = 0;
  const int steps = model.changes_every_step() ? kPaths : 1;
  for (int s = 0; s < steps; ++s) {
    TracedStep step;
    TraceExtras extras;
    extras.gradients = gradients;
    extras.bucket_of = bucket_of;
    extras.capture_graph = true;
    extras.seed_counter = counter;
    {
      const auto [x, y] = traced_batch(info, micro, /*meta=*/true, c.parallel.context_parallel);
      trace_forward_backward(c, model, arena, x, y, step, &extras);
    }
    counter = extras.seed_counter;
    if (s == 0 || step.step_peak_bytes > best.step_peak_bytes) {
      best = std::move(step);
      kept = std::move(extras);
    }
  }
  return best;
}

}  // namespace

ModelProfile trace_profile(const Config& config, const DataInfo& info, const TraceRequest& request) {
  const auto start = std::chrono::steady_clock::now();
  const DeclaredWorkspaces declared(request.workspaces);
  const TracedForGpu traced_for(request.gpu);
  ModelProfile profile = job_figures(config, info, request);
  const std::shared_ptr<CpuArena> arena = make_meta_arena(int64_t{1} << 45);
  MetaArenaScope scope(arena);
  std::shared_ptr<Model> model;
  {
    MetaParametersScope on_meta;
    at::manual_seed(config.job.seed);
    model = make_model(config, info, /*tensor_rank=*/0);
    if (config.training.channels_last) model->use_channels_last();  // as the job lays it out
  }
  describe_model(config, *model, profile);
  const std::unordered_map<const c10::TensorImpl*, size_t> bucket_of =
      record_block_buckets(*model, config.parallel.bucket_mb << 20, profile);
  // The trainer's gradient block, in data parallelism's reduction order (training/trainer.cpp).
  const int64_t before_gradients = arena->stats().in_use;
  const GradientBuffer gradients(DataParallel(std::make_shared<LocalCommunicator>(), model->parameters(),
                                              config.parallel.bucket_mb << 20).reduction_order());
  profile.gradient_bytes = arena->stats().in_use - before_gradients;
  // A deep decoder's steps from a few of its layers (no workspaces declared: a catalog device's).
  std::unique_ptr<LayerTraces> layers =
      request.workspaces == WorkspaceRules::kNone
          ? LayerTraces::make(config, info, *model, bucket_of, request.stretch_beyond_layers)
          : nullptr;
  const double optimizer_ms =
      optimizer_step_ms(profile.parameters, static_cast<int64_t>(model->parameters().size()),
                        config.training.optimizer == OptimizerKind::kAdamw, config.training.grad_clip > 0, request.rates,
                        request.fused_optimizer);
  TracedStep first_optimizer;
  bool stepped = false;
  for (MixedPrecision precision : request.precisions) {
    Config c = config;
    c.training.mixed_precision = precision;
    const size_t first = profile.points.size();
    for (int64_t micro : request.micro_batches) {
      const size_t traced = profile.points.size() - first;
      const ProfilePoint* a = traced >= 2 ? &profile.points[first] : nullptr;
      const ProfilePoint* b = traced >= 2 ? &profile.points[first + 1] : nullptr;
      // Declared workspaces are not affine in the micro-batch (a max of two reorders, a kernel
      // switch at 16 images), nor is a heaviest path (another size's may be another path):
      // then every size is traced.
      const bool affine = request.workspaces == WorkspaceRules::kNone && !model->changes_every_step();
      if (a != nullptr && affine && same_shape(a->trace, b->trace)) {
        profile.points.push_back(derived_point(*a, *b, micro, request.rates));
      } else {
        TraceExtras extras;
        TracedStep step;
        if (layers != nullptr && !layers->trace(c, arena, info, micro, step, extras)) {
          profile.how += "; " + layers->why();
          layers.reset();
        }
        if (layers == nullptr) step = traced_step(c, *model, arena, info, micro, &gradients, &bucket_of, extras);
        if (!stepped) {  // the state once: it is the same at every size and precision
          // A stretched step ran no backward through the deep model: its gradients are the
          // slots backward would have filled (runtime/tape.cpp).
          for (at::Tensor p : model->parameters()) {
            if (p.grad().defined()) continue;
            const at::Tensor slot = gradients.slot(p);
            if (slot.defined()) p.mutable_grad() = slot;
          }
          trace_optimizer_step(c, *model, *arena, first_optimizer, request.fused_optimizer);
          profile.optimizer_state_bytes = first_optimizer.optimizer_state_bytes;
          stepped = true;
        }
        step.optimizer_state_bytes = first_optimizer.optimizer_state_bytes;
        step.optimizer_peak_bytes = first_optimizer.optimizer_peak_bytes;
        profile.points.push_back(traced_point(step, extras, profile, micro, precision, request, optimizer_ms));
      }
      const bool two = profile.points.size() - first >= 2;
      if (request.device_memory > 0 && two && profile.points.back().activation_bytes() > request.device_memory) break;
    }
  }
  if (layers != nullptr)
    profile.how += ", each step stretched from its first " + std::to_string(LayerTraces::kTraced) + " of " +
                   std::to_string(layers->layers()) + " layers (checked against " + std::to_string(LayerTraces::kTraced + 1) + ")";
  profile.seconds = seconds_since(start);
  return profile;
}

}  // namespace ht

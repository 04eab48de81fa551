#include "launcher/planning/profiler.h"
#include "base/clock.h"

#include "launcher/planning/meta_trace.h"
#include "launcher/planning/profile_parts.h"

#include "launcher/config/run_plan_of.h"

#include "launcher/model_factory.h"
#include "training/trainer.h"
#include "alloc/byte_size.h"
#include "alloc/cpu_arena.h"
#include "alloc/cpu_device_allocator.h"
#include "parallel/data_parallel.h"
#include "planner/cost_model.h"
#include "planner/pipeline_terms.h"
#include "planner/step_recorder.h"
#include "runtime/thread_pools.h"
#include "base/user_error.h"

#include <algorithm>
#include <chrono>
#include <set>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

namespace ht {
namespace {

// The config of one profiled point: one micro-batch per step, nothing written, nothing evicted.
Config point_config(const Config& job, int64_t micro, MixedPrecision precision) {
  Config c = job;
  c.training.global_batch_size = micro;
  c.training.micro_batch_size = 0;
  c.training.steps = 100;  // never reached: the profiler runs the steps it measures
  c.training.mixed_precision = precision;
  // Casts at each read: the planner prices kept 16-bit copies from the casts this step makes
  // (planner/weight_copy_terms.h).
  c.training.compute_weights = ComputeWeightsMode::kCast;
  // fp32 gradients: the planner prices bf16 ones from them (planner/gradient_blocks.h, gradient_element_bytes).
  c.training.gradient_dtype = GradientDtype::kFp32;
  c.parallel.data_parallel = 1;
  c.parallel.pipeline_parallel = 1;  // one rank runs the whole model: the blocks' times are what stages cut
  c.parallel.shard = ShardLevel::kNone;  // one rank holds the whole state; the cost model divides it
  c.memory.policy = MemoryPolicy::kNone;
  c.memory.trace = false;
  c.checkpoint.interval = 0;
  return c;
}

// The first `samples` of the training set (host memory, outside the arena); with
// parallel.context_parallel = c, rank 0's chunks of each.
DataSplits point_data(const Dataset& train, const DataInfo& info, int64_t samples, const ContextLayout& context) {
  HostAllocationScope host;
  DataSplits d;
  const Batch b = context_part(train.slice(0, std::min(samples, train.size())), context);
  d.train = std::make_unique<TensorDataset>(b.input.clone(), b.target.clone());
  d.eval = std::make_unique<TensorDataset>(b.input.clone(), b.target.clone());
  d.info = info;
  return d;
}

// Every step is captured as static plans see it (nothing planned, nothing evicted): the
// planner predicts a plan at any budget from the recorded step's graph.
void capture_steps(Trainer& trainer) {
  MemoryManager& memory = trainer.memory();
  MemoryOptions options = memory.options();
  StaticPlanOptions capture;
  capture.capture_only = true;
  capture.static_layout = false;
  options.static_plans = capture;
  memory.configure(std::move(options));  // no kernel has run yet
}

struct Profiling {
  const Config& config;
  const Dataset& train;
  const DataInfo& info;
  std::shared_ptr<CpuArena> arena;
  std::shared_ptr<Model> model;
  ModelProfile& profile;
  std::unordered_map<const c10::TensorImpl*, size_t> block_bucket_of;  // a parameter's bucket, cut at blocks
};

ProfilePoint measure_point(Profiling& p, int64_t micro, MixedPrecision precision, int threads) {
  set_compute_threads(threads);
  const Config c = point_config(p.config, micro, precision);
  const int64_t before = p.arena->stats().in_use;
  // A split model's rank, its group mirrored: its part's memory and kernels, no other rank. A
  // context-parallel rank trains rank 0's chunks of each sequence, cut here: to the trainer it is
  // one rank (no replicas to average over), to the model and its attention rank 0 of c.
  std::shared_ptr<Communicator> mirror, context;
  if (c.parallel.tensor_parallel > 1) mirror = std::make_shared<MirrorCommunicator>(static_cast<int>(c.parallel.tensor_parallel));
  if (c.parallel.context_parallel > 1) context = std::make_shared<MirrorCommunicator>(static_cast<int>(c.parallel.context_parallel));
  ProcessGrid grid;  // one rank; a split model's rank 0
  grid.tensor_parallel = static_cast<int>(c.parallel.tensor_parallel);
  const ContextLayout chunks{c.parallel.context_parallel, 0};
  const std::unique_ptr<Trainer> made = Trainer::make(run_plan_of(c, grid), point_data(p.train, p.info, 2 * micro, chunks),
                                                      p.model, p.arena, {nullptr, nullptr, mirror, context});
  Trainer& trainer = *made;
  capture_steps(trainer);
  p.profile.gradient_bytes = p.arena->stats().in_use - before;  // the gradient block
  trainer.measure_step();  // warm-up: optimizer state, the sampler's order, kernels' first use
  p.profile.optimizer_state_bytes =
      p.arena->stats().in_use - before - p.profile.gradient_bytes - sampler_bytes(std::min(2 * micro, p.train.size()));

  ProfilePoint point;
  point.micro_batch = micro;
  point.precision = precision;
  point.threads = threads;
  Trainer::StepMeasurement m;
  {
    MemoryManager& memory = trainer.memory();
    StepRecorder recorder(memory, p.arena->stats().in_use);
    recorder.set_gradient_buckets(p.block_bucket_of);
    BackwardReads reads;
    trainer.interpreter().set_parameter_source(&reads);
    trainer.interpreter().set_compute_weights(&reads);
    p.model->set_block_listener([&](int block) {
      recorder.enter_block(block);
      memory.block_begins(block);
      reads.in_backward = block < 0;
    });
    m = trainer.measure_step();
    p.model->set_block_listener(nullptr);
    trainer.interpreter().set_parameter_source(nullptr);
    trainer.interpreter().set_compute_weights(nullptr);
    point.backward_read_buckets = buckets_read(reads.read, p.block_bucket_of);
    point.backward_copy_buckets = buckets_read(reads.copies_saved(), p.block_bucket_of);
    point.backward_fp32_buckets = buckets_read(reads.saved, p.block_bucket_of);
    precision_reads(reads, p.block_bucket_of, point.half_read_buckets, point.fp32_read_elements);
    point.trace = recorder.take();
    if (const CapturedStep* step = memory.static_planner()->last_step()) {
      point.graph = step->graph;
      point.block_starts = step->block_starts;
    }
  }
  point.peak_bytes = m.peak_bytes;
  // Times are the fastest of a few steps. This machine's speed drifts by 10-30% over seconds (a
  // shared VM: one run three times over gave median steps of 254, 196 and 197 ms and fastest ones
  // of 189, 168 and 168), so a median of a few steps is a draw from the drift; the fastest is the
  // machine unloaded, the one figure a prediction can stand for (bench_planner_accuracy compares
  // it with a run's fastest quarter). A graph that changes every step (the supernet's sampled
  // path) does different work each step: its median, since its fastest is its cheapest path.
  // Memory is the recorded step's, which every step repeats.
  std::vector<Trainer::StepMeasurement> steps{m};
  for (double spent = m.step_ms; steps.size() < 6 && (steps.size() < 2 || spent < 400);) {
    steps.push_back(trainer.measure_step());
    spent += steps.back().step_ms;
  }
  const bool same_work = std::all_of(steps.begin(), steps.end(), [&](const Trainer::StepMeasurement& s) {
    return s.forward_backward_peak_bytes == m.forward_backward_peak_bytes;
  });
  auto estimate = [&](double Trainer::StepMeasurement::*field) {
    std::vector<double> v;
    for (const auto& s : steps) v.push_back(s.*field);
    const auto at = same_work ? v.begin() : v.begin() + static_cast<long>(v.size() / 2);
    std::nth_element(v.begin(), at, v.end());
    return *at;
  };
  point.step_ms = estimate(&Trainer::StepMeasurement::step_ms);
  point.forward_backward_ms = estimate(&Trainer::StepMeasurement::forward_backward_ms);
  point.optimizer_ms = estimate(&Trainer::StepMeasurement::optimizer_ms);
  // The recorded step's kernels, timed once, scaled to the fastest step: the parts a plan adds up
  // (regenerations, a stage's blocks, swaps) then come from the same machine as the whole.
  if (m.forward_backward_ms > 0) {
    const double scale = point.forward_backward_ms / m.forward_backward_ms;
    for (TraceKernel& k : point.trace.kernels) k.ms *= scale;
  }
  // A graph that changes every step (the supernet) peaks differently each step: the highest.
  for (const auto& s : steps) {
    point.peak_bytes = std::max(point.peak_bytes, s.peak_bytes);
    point.forward_backward_peak_bytes = std::max(point.forward_backward_peak_bytes, s.forward_backward_peak_bytes);
    point.optimizer_peak_bytes = std::max(point.optimizer_peak_bytes, s.optimizer_peak_bytes);
  }
  point.persistent_bytes = m.in_use_before;  // the sampler's order of the point's data included
  point.batch_bytes = batch_bytes(p.profile, micro);
  point.blocks = block_times(point.trace, p.model->blocks().size());
  set_stage_terms(point);
  return point;
}

// The micro-batch sizes to train: every power of two up to the largest a plan uses, and that
// largest, unless a point's step would take more than the cap: beyond it the model extrapolates.
// A point costs about its step time, so the sizes below the largest cost less than it together.
// Why every size: on a CPU a step's time is not affine in the micro-batch (a kernel's working
// set leaving the cache bends it), and neither the line through two trained sizes nor their
// kernels priced by their work predicts a third (bench_planner_local_time: median 14% and 17%
// off on the sizes between and below, against 3% between two trainings of one size).
// The step's cost here is the modelled one (runtime/kernel_cost.h; backward taken as twice
// forward), not the measured one: which sizes are measured, and so every prediction made from
// them, must not change with how busy the machine is (a loaded CI machine once halved the larger
// size and extrapolated a peak 8% low).
std::vector<int64_t> point_sizes(const ProfilePoint& small, const ProfileRequest& r) {
  const int64_t largest = r.largest_micro_batch;
  double forward_ms = 0;
  for (const TraceKernel& k : small.trace.kernels) forward_ms += k.modeled_ms;
  const double per_sample = 3 * forward_ms / static_cast<double>(small.micro_batch);
  int64_t hi = largest;
  while (hi > 2 * small.micro_batch && per_sample * static_cast<double>(hi) > r.point_ms_cap) hi /= 2;
  std::vector<int64_t> sizes;
  for (int64_t m = 1; m < hi; m *= 2) sizes.push_back(m);
  sizes.push_back(hi);
  if (std::find(sizes.begin(), sizes.end(), small.micro_batch) == sizes.end()) sizes.push_back(small.micro_batch);
  std::sort(sizes.begin(), sizes.end());
  return sizes;
}

// A step of more samples does at least the work of a step of fewer, and this machine's drift only
// ever slows a measurement down: a size measured slower than a larger one was measured in a slow
// moment, and the larger one's time bounds it (a tiny ConvNet once measured 4.8 ms at 2 samples
// and 3.1 at 16). Each trained point's forward and backward is the least measured at its size or
// any larger one of its precision and threads, its kernels and step shortened with it.
void bound_by_larger_sizes(ModelProfile& profile) {
  std::vector<ProfilePoint*> points;
  for (ProfilePoint& p : profile.points) points.push_back(&p);
  std::sort(points.begin(), points.end(), [](const ProfilePoint* a, const ProfilePoint* b) {
    return std::tie(a->precision, a->threads, b->micro_batch) < std::tie(b->precision, b->threads, a->micro_batch);
  });
  for (size_t i = 1; i < points.size(); ++i) {
    ProfilePoint& p = *points[i];
    const ProfilePoint& larger = *points[i - 1];
    if (larger.precision != p.precision || larger.threads != p.threads) continue;
    if (larger.forward_backward_ms >= p.forward_backward_ms || p.forward_backward_ms <= 0) continue;
    const double scale = larger.forward_backward_ms / p.forward_backward_ms;
    p.step_ms -= p.forward_backward_ms - larger.forward_backward_ms;
    p.forward_backward_ms = larger.forward_backward_ms;
    for (TraceKernel& k : p.trace.kernels) k.ms *= scale;
    p.blocks = block_times(p.trace, p.blocks.size());
  }
}

// The largest micro-batch a profile point may train in `room` bytes of this host, from meta
// traces of one and two samples at each precision (every tensor the step makes, in no memory; a
// tenth of a second each): the model, its optimizer's state and peak, and the step's peak, which
// is affine in the samples. A point past the host's memory is not tried: the kernel's OOM killer
// ends the plan without a word (GPT-2 124M's first point, 64 samples of 1024 tokens, needed more
// than 24 GiB). UserError where one sample does not fit.
int64_t largest_point_here(const Config& config, const DataInfo& info, const std::vector<MixedPrecision>& precisions,
                           int64_t room) {
  int64_t base = 0, per_sample = 0;
  for (MixedPrecision precision : precisions) {
    const TracedStep one = trace_micro_batch(point_config(config, 1, precision), info, 1);
    const TracedStep two = trace_micro_batch(point_config(config, 2, precision), info, 2);
    const int64_t slope = std::max<int64_t>(1, two.step_peak_bytes - one.step_peak_bytes);
    per_sample = std::max(per_sample, slope);
    base = std::max(base, one.model_bytes + one.optimizer_peak_bytes + one.step_peak_bytes - slope);
  }
  const int64_t fits = (room - base) / per_sample;
  if (fits < 1) {
    throw UserError(config.source + ": profiling trains this model here, and one sample's step needs " +
                    format_bytes(base + per_sample) + " of host memory (" + format_bytes(room) +
                    " free to it): plan it for the devices it will train on with --cluster KIND:NODESxDEVICES "
                    "(traced, never run; configs/devices.toml lists the kinds), e.g. --cluster h100-sxm:1x8");
  }
  return fits;
}

}  // namespace

ModelProfile profile_job(const Config& config, const Dataset& train, const DataInfo& info,
                         const ProfileRequest& asked) {
  const auto start = std::chrono::steady_clock::now();
  ProfileRequest request = asked;
  int64_t host_cap = 0;  // > 0: the points stop at this size for the host's memory
  if (config.training.device == "cpu" && request.sizes.empty()) {
    // Four fifths of what is free: libtorch, the data and the page cache keep the rest.
    const int64_t largest = largest_point_here(config, info, request.precisions, host_available_memory_bytes() / 5 * 4);
    if (largest < request.largest_micro_batch) host_cap = request.largest_micro_batch = largest;
  }
  ModelProfile profile = job_profile(config, info, train.size());
  profile.threads = request.threads;
  {
    const Batch one = context_part(train.slice(0, 1), ContextLayout{config.parallel.context_parallel, 0});
    profile.input_sample_bytes = static_cast<int64_t>(one.input.nbytes());
    profile.target_sample_bytes = static_cast<int64_t>(one.target.nbytes());
  }
  // An arena as large as the host's memory: pages are committed only when written.
  auto arena = std::make_shared<CpuArena>(host_physical_memory_bytes());
  ModelProfile* out = &profile;
  {
    ArenaScope scope(arena);
    at::manual_seed(config.job.seed);  // the job seeds again before building its own model
    std::shared_ptr<Model> model = make_model(config, info);
    model->move_to(at::Device(config.training.device), at::kFloat);
    if (config.training.channels_last) model->use_channels_last();
    describe_model(config, *model, profile);
    Profiling p{config, train, info, arena, model, *out,
                record_block_buckets(*model, config.parallel.bucket_mb << 20, profile)};
    const MixedPrecision first = request.precisions.front();
    // The first point sets the sizes (its modelled cost), unless they are given.
    const int64_t first_size =
        request.sizes.empty() ? std::max<int64_t>(1, request.largest_micro_batch / 8) : request.sizes.front();
    ProfilePoint small = measure_point(p, first_size, first, request.threads);
    const std::vector<int64_t> sizes = request.sizes.empty() ? point_sizes(small, request) : request.sizes;
    for (MixedPrecision precision : request.precisions) {
      for (int64_t m : sizes) {
        if (precision != first || m != small.micro_batch) profile.points.push_back(measure_point(p, m, precision, request.threads));
      }
    }
    profile.points.insert(profile.points.begin(), std::move(small));
    if (request.one_thread_point && request.threads > 1) {
      // At the larger size: at small ones a VM's second thread can even slow a step down, and
      // plans run at the larger sizes.
      profile.points.push_back(measure_point(p, *std::max_element(sizes.begin(), sizes.end()), first, 1));
    }
    set_compute_threads(request.threads);
  }
  bound_by_larger_sizes(profile);
  if (host_cap > 0) {
    profile.how += " up to " + std::to_string(host_cap) + " samples, what this host's memory holds (larger "
                   "sizes' times extrapolated)";
  }
  profile.seconds = seconds_since(start);
  return profile;
}

}  // namespace ht

#include "launcher/training/trainer.h"

#include "launcher/training/compact.h"
#include "launcher/training/state_offload.h"
#include "launcher/training/stop_signals.h"
#include "launcher/training/optimizer.h"
#include "alloc/byte_size.h"
#include "alloc/cpu_device_allocator.h"
#include "alloc/cuda_arena.h"
#include "alloc/host_link.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>

namespace ht {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::unique_ptr<LossScaler> make_loss_scaler(const TrainingConfig& t) {
  if (t.mixed_precision != MixedPrecision::kFp16) return nullptr;
  return std::make_unique<LossScaler>(
      LossScalerOptions{t.loss_scale, t.loss_scale_growth, t.loss_scale_backoff, t.loss_scale_growth_interval});
}

// Sharded parameters are gathered a block at a time: their buckets end where blocks do. So do
// sharded gradients': a bucket's gradient block then lives from its block's first gradient to its
// reduce-scatter, which the planner places along the traced step (planner/shard_terms.h); a bucket
// cut by size alone straddles blocks, and when its own first gradient comes is not in the trace.
std::vector<int> bucket_units(const Config& config, const Model& model) {
  if (config.parallel.shard < ShardLevel::kGradients || config.replicas() <= 1) return {};
  return model.parameter_blocks();
}

}  // namespace

// launcher/training/trainer_pipeline.cpp
std::unique_ptr<PipelineStage> make_pipeline_stage(const Config& config, const DataSplits& data, Model& model,
                                                   Communicator* replicas, std::shared_ptr<Communicator> pipeline,
                                                   std::shared_ptr<Communicator> tensor);

Trainer::Trainer(const Config& config, DataSplits data, std::shared_ptr<Model> model,
                 std::shared_ptr<CpuArena> arena, std::shared_ptr<Communicator> replicas,
                 std::shared_ptr<Communicator> pipeline, std::shared_ptr<Communicator> tensor)
    : config_(config), data_(std::move(data)), model_(std::move(model)), params_(model_->parameters()),
      optimizer_(make_optimizer(config.training, params_)),
      sampler_(data_.train->size(), config.training.global_batch_size, static_cast<uint64_t>(config.job.seed),
               config.data.shuffle, replicas ? replicas->rank() : 0, replicas ? replicas->size() : 1),
      pipeline_(make_pipeline_stage(config, data_, *model_, replicas.get(), std::move(pipeline), tensor)),
      arena_(std::move(arena)), scaler_(make_loss_scaler(config.training)),
      tensor_(tensor ? std::make_unique<TensorGroup>(std::move(tensor)) : nullptr),
      // A stage reduces the parameters it trains. Its point-to-point messages (a tensor-parallel
      // rank's collectives) come from the main thread while backward runs, so its all-reduce
      // waits for the step's end (MPI is initialized for one thread at a time).
      replicas_(replicas ? replicas : std::make_shared<LocalCommunicator>(),
                pipeline_ ? pipeline_->parameters() : params_, config.parallel.bucket_mb << 20,
                config.parallel.overlap && !pipeline_ && !tensor_, bucket_units(config, *model_)),
      interp_(InterpreterOptions{ExecutionMode::kInterpreted, static_cast<uint64_t>(config.job.seed)}, &memory_),
      checkpoints_(config.checkpoint_dir(), config.checkpoint.keep), device_(config.training.device),
      total_steps_(config.training.steps > 0 ? config.training.steps
                                             : config.training.epochs * sampler_.batches_per_epoch()),
      progress_(total_steps_, config.metrics.log_interval) {
  TORCH_CHECK(replicas_.size() == config.replicas(), "Trainer: a group of ", replicas_.size(),
              " ranks for parallel.data_parallel = ", config.replicas());
  replicas_.group().set_timeout(config.parallel.timeout_s);
  if (pipeline_) pipeline_->group().set_timeout(config.parallel.timeout_s);
  if (tensor_) {
    tensor_->communicator().set_timeout(config.parallel.timeout_s);
    interp_.set_tensor_parallel(tensor_.get());
  }
  progress_.set_silent(!writes_outputs());
  if (replicas_.size() > 1 || pipeline_ || tensor_) progress_.use_log_lines();
  replicas_.broadcast_state(model_->buffers());
  model_->train();
  interp_.set_autocast(autocast_type(config.training.mixed_precision));
  interp_.set_relu_masks(config.memory.compress != Compression::kOff);
  if (config.metrics.time_by_op && !pipeline_) interp_.set_op_time_log(&op_times_);
  interp_.set_keep_collectives(keeps_collectives(config));
  if (swaps(config.memory.policy) && arena_) {
    host_link_ = std::make_shared<HostLink>(config.memory.host_link_gbps);
    char line[256];
    std::snprintf(line, sizeof line,
                  "host swap: a link of %.1f GB/s each way (memcpy on this host: %.1f GB/s), host memory for "
                  "copies %s",
                  config.memory.host_link_gbps, measure_memcpy_gbps(), format_bytes(config.memory.host_budget_bytes).c_str());
    progress_.line(line);
    if (config.memory.optimizer_state == StatePlace::kHost) state_offload_ = std::make_unique<StateOffload>(host_link_);
  }
  memory_.configure(memory_options());
  if (!arena_ && device_.is_cuda()) {
    library_workspace_bytes_ =
        std::max<int64_t>(0, make_cuda_library_workspaces(device_.has_index() ? device_.index() : 0));
  }
  if (memory_.static_planner() != nullptr || memory_.options().checkpoint_blocks > 0) {
    // Segments end at blocks; the capture of a step notes where each began; "full" drops blocks there.
    model_->set_block_listener([this](int block) { memory_.block_begins(block); });
  }
  const bool sharded = config.parallel.shard != ShardLevel::kNone && replicas_.size() > 1;
  if (sharded && config.parallel.shard == ShardLevel::kParameters) {
    shard_parameters();  // each rank keeps its share; buckets gathered where read
  } else if (arena_ || sharded) {
    compact_parameters(sharded);
  }
  if (sharded && config.parallel.shard >= ShardLevel::kGradients) {
    // Each bucket's block only while backward fills it, then this rank's share of its sum
    // (parallel/gradient_shards.h).
    grad_shards_ = std::make_unique<GradientShards>(replicas_.shared_group(), params_, replicas_.buckets());
    interp_.set_gradient_buffer(grad_shards_.get());
    if (param_shards_) grad_shards_->set_bucket_done([this](size_t b) { param_shards_->bucket_done(b); });
    overlap_reduce_scatters();
  } else if (arena_ || replicas_.size() > 1) {
    // Under a budget, gradients get one block beside the parameters (alloc/gradient_buffer.h).
    // Laid out in the order data parallelism reduces them, each bucket is a span of the block,
    // reduced in place: no copies, and no memory beyond the gradients while backward runs.
    gradients_ = std::make_unique<GradientBuffer>(replicas_.reduction_order());
    interp_.set_gradient_buffer(gradients_.get());
    replicas_.use_gradient_buffer(gradients_.get());
  }
  if (sharded) set_up_sharding();
  if (config.parallel.shard != ShardLevel::kNone && replicas_.size() == 1) {
    progress_.line("warning: parallel.shard = \"" + std::string(choice_name(config.parallel.shard)) +
                   "\" has no effect with one data-parallel rank: each rank's share is the whole");
  }
  if (config.parallel.overlap && replicas_.size() > 1 && pipeline_) {
    progress_.line("warning: parallel.overlap: a pipeline stage all-reduces its gradients after the step's last "
                   "backward (its point-to-point messages use MPI while backward runs)");
  } else if (config.parallel.overlap && replicas_.size() > 1 && tensor_) {
    progress_.line("warning: parallel.overlap: a tensor-parallel rank reduces its gradients on the thread running "
                   "backward, after it (sharded gradients: as backward finishes each bucket); its group's "
                   "collectives use MPI while backward runs");
  } else if (config.parallel.overlap && replicas_.size() > 1 && !replicas_.overlaps()) {
    progress_.line("warning: parallel.overlap: this MPI library gives no MPI_THREAD_SERIALIZED; gradients are "
                   "all-reduced after backward");
  }
}

// A tensor-parallel group's ranks choose alike what to evict only under DTR with modelled costs;
// under any other policy collectives' outputs stay, and recomputations stop at them.
bool keeps_collectives(const Config& c) {
  const MemoryConfig& m = c.memory;
  return c.parallel.tensor_parallel > 1 &&
         (plans_statically(m.policy) || swaps(m.policy) || m.kernel_costs == KernelCosts::kMeasured);
}

MemoryOptions Trainer::memory_options() const {
  MemoryOptions options;
  options.arena = arena_;
  const MemoryConfig& m = config_.memory;
  options.eviction_threshold = m.eviction_threshold;
  if (arena_ && evicts(m.policy)) {
    if (plans_statically(m.policy)) {
      StaticPlanOptions plans;
      plans.source = m.policy == MemoryPolicy::kSegments ? PlanSource::kSegments : PlanSource::kSolver;
      plans.sightings_before_planning = m.policy == MemoryPolicy::kAuto ? 2 : 1;
      plans.solve_time_limit_s = m.solve_time_s;
      // The heuristic alone weighs modelled costs: the same plan every run. The MIP weighs measured
      // times (docs/status.md, "What is not built yet": with modelled ones, ResNet-18's plan replays badly).
      plans.modeled_costs = m.solve_time_s == 0 && m.kernel_costs == KernelCosts::kModeled;
      plans.static_layout = m.static_layout;
      options.static_plans = plans;
    }
    EvictionOptions eviction;  // DTR: the policy, or the safety net and fallback of static plans
    eviction.heuristic = *eviction_heuristic(m.policy);
    if (swaps(m.policy)) {
      SwapOptions swap;
      swap.rule = m.policy == MemoryPolicy::kSwap ? SwapRule::kConvAndMatmul : SwapRule::kHidden;
      swap.link = host_link_;
      swap.host_budget_bytes = m.host_budget_bytes;
      swap.bf16_on_link = m.compress == Compression::kBf16;
      options.swap = swap;
    }
    eviction.sqrt_sampling = m.sqrt_sampling;
    eviction.ignore_small = m.ignore_small;
    eviction.window = m.eviction_window;
    eviction.costs = m.kernel_costs;
    eviction.seed = static_cast<uint64_t>(config_.job.seed);
    options.eviction = eviction;
    if (recomputes_blocks(m.policy)) options.checkpoint_blocks = static_cast<int>(model_->blocks().size());
  }
  return options;
}

void Trainer::trace_step_begins() {
  if (!config_.memory.trace || state_.step >= config_.memory.trace_steps || !writes_outputs()) return;
  if (!timeline_) {
    // Opened at the first traced step, not before: a run that fails its checks writes nothing.
    timeline_ = std::make_unique<MemoryTimeline>(config_.job.output_dir + "/memory_trace.json", arena_.get());
    // The trace must see this interpreter's kernels: it was configured without one.
    memory_.set_timeline(timeline_.get());
  }
  timeline_->set_recording(true);
  timeline_->marker("step " + std::to_string(state_.step + 1));
}

void Trainer::trace_step_ended() {
  if (!timeline_ || !timeline_->recording()) return;
  timeline_->set_recording(false);
  if (state_.step >= config_.memory.trace_steps || state_.step == total_steps_) {
    timeline_->close();
    progress_.line("memory trace: " + timeline_->path());
  }
}

double Trainer::forward_backward(const Batch& micro, double loss_scale, bool last) {
  // One micro-batch is the step a static plan captures and runs (memory/static_plan.h).
  struct Step {
    MemoryManager& memory;
    explicit Step(MemoryManager& m) : memory(m) { memory.begin_step(); }
    // A step that threw is not one to plan from.
    ~Step() { memory.end_step(/*completed=*/std::uncaught_exceptions() == 0); }
  } step{memory_};
  Tensor loss = model_->loss(model_->forward(interp_.input(micro.input.to(device_))),
                             interp_.input(micro.target.to(device_)));
  // The last micro-batch's backward starts the all-reduce of each bucket whose gradients it has
  // finished; an earlier one would add to gradients being reduced.
  struct Listening {
    Interpreter& interp;
    ~Listening() { interp.set_gradient_listener(nullptr); }  // also when backward throws
  } listening{interp_};
  // Sharded gradients: every backward reduce-scatters its buckets as they are done.
  GradientListener* listener = grad_shards_ ? static_cast<GradientListener*>(grad_shards_.get())
                               : last && replicas_.overlaps() ? &replicas_
                                                              : nullptr;
  interp_.set_gradient_listener(listener);
  // d(scale * loss) = scale * d(loss): seeding backward with the scale adds no op to the graph.
  interp_.backward({loss}, {at::full(loss.sizes(), loss_scale, loss.options())});
  if (grad_shards_) grad_shards_->backward_ended();
  if (param_shards_) param_shards_->release_all();  // the next forward gathers from its first block
  return loss.value().item<double>();
}

int64_t Trainer::device_peak_bytes() const {
  if (arena_) return arena_->stats().peak_in_use;
  if (device_.is_cpu()) return CpuAllocationCounter::install().device_peak_bytes();
  if (device_.is_cuda()) {
    return cuda_allocated_peak_bytes(device_.has_index() ? device_.index() : 0) - library_workspace_bytes_;
  }
  return -1;
}

void Trainer::reset_device_peak() {
  CpuAllocationCounter::install().reset_peak();
  if (arena_) {
    arena_->reset_peak();
  } else if (device_.is_cuda()) {
    reset_cuda_allocated_peak(device_.has_index() ? device_.index() : 0);
  }
}

Trainer::StepResult Trainer::train_step() {
  op_times_.clear();  // an evaluation's kernels are not the step's
  reset_device_peak();
  memory_.reset_peak();
  const MemoryStats before = memory_.stats();
  const SwapStats swap_before = memory_.swap_stats() ? *memory_.swap_stats() : SwapStats{};
  trace_step_begins();
  const auto start = std::chrono::steady_clock::now();
  StepResult r;
  replicas_.group().set_context("step " + std::to_string(state_.step + 1));
  if (tensor_) tensor_->communicator().set_context("step " + std::to_string(state_.step + 1));
  const Batch batch = data_.train->batch(sampler_.next());
  const int64_t micro_batches = config_.micro_batches(), micro_size = config_.micro_batch_size();
  const TensorGroupStats tensor_before = tensor_ ? tensor_->stats() : TensorGroupStats{};
  const auto compute_start = std::chrono::steady_clock::now();
  if (pipeline_) {
    r.loss = pipeline_step(batch, r);
  } else {
    for (int64_t k = 0; k < micro_batches; ++k) {
      const Batch micro{batch.input.narrow(0, k * micro_size, micro_size),
                        batch.target.narrow(0, k * micro_size, micro_size)};
      const double scale = (scaler_ ? scaler_->scale() : 1.0) / static_cast<double>(micro_batches);
      r.loss += forward_backward(micro, scale, k + 1 == micro_batches) / static_cast<double>(micro_batches);
    }
  }
  r.forward_backward_ms = seconds_since(compute_start) * 1e3;
  if (tensor_) {
    r.tensor_bytes = tensor_->stats().bytes - tensor_before.bytes;
    r.tensor_recomputed_bytes = tensor_->stats().recomputed_bytes - tensor_before.recomputed_bytes;
  }
  // The two phases' peaks apart: forward and backward's grows with the micro-batch, the
  // optimizer's with the largest tensor it steps (the planner scales each on its own).
  r.forward_backward_peak_bytes = device_peak_bytes();
  reset_device_peak();
  // This rank's gradients of its slice are complete: average them over the replicas, once per
  // optimizer step, never per micro-batch (with overlap, most buckets are under way already).
  // Sharded gradients were reduce-scattered by every micro-batch's backward: their sums become means.
  if (grad_shards_) {
    grad_shards_->finish_step();
    r.comm = grad_shards_->stats();
  } else {
    replicas_.average_gradients();
    r.comm = replicas_.stats();
  }
  r.loss = replicas_.mean(r.loss, "the loss");
  r.lr = learning_rate_at(config_.training, state_.step, total_steps_);
  const auto optimizer_start = std::chrono::steady_clock::now();
  StepAcrossStages stages;
  if (pipeline_) {
    stages.gradient_norm = [this] { return combine_norms(pipeline_->gradient_norms()); };
    stages.all_finite = [this](bool finite) { return pipeline_->all_stages(finite); };
  } else if (grad_shards_) {
    stages = shard_step_hooks();  // each rank holds its share of the gradients
  }
  if (tensor_) stages = tensor_step_hooks();  // each rank holds its parts of the split parameters
  const StateOffloadStats state_before = state_offload_ ? state_offload_->stats() : StateOffloadStats{};
  if (state_offload_) state_offload_->to_device(*optimizer_, state_params(), device_);
  if (grad_shards_) {
    shard_->attach_gradients(*grad_shards_);  // this rank's share of the averaged gradients
  } else if (shard_) {
    shard_->attach_gradients();  // this rank's pieces of the averaged gradients
  }
  // With sharded gradients only the pieces have any: unscaled, checked and clipped there.
  const std::vector<at::Tensor>& stepped = grad_shards_ ? shard_->pieces() : params_;
  const StepOutcome outcome = optimizer_step(*optimizer_, stepped, config_.training, r.lr, scaler_.get(), stages);
  r.grad_norm = outcome.grad_norm;
  r.skipped = !outcome.stepped;
  if (shard_) {
    shard_->detach_gradients();
    if (param_shards_) {
      // Sharded parameters: the next forward gathers the updated shards; this step's gathers.
      const ParameterGatherStats g = param_shards_->take_stats();
      r.shard = ShardStats{g.ms, g.bytes, g.drops, g.hidden()};
    } else {
      if (outcome.stepped) shard_->gather_parameters();  // a skipped step changed no piece on any rank
      r.shard = outcome.stepped ? shard_->stats() : ShardStats{};
    }
  }
  clear_grads(params_);
  if (arena_ && !state_compacted_) state_compacted_ = compact_optimizer_state(*optimizer_, state_params());
  if (state_offload_) {
    state_offload_->to_host(*optimizer_, state_params());
    const StateOffloadStats& s = state_offload_->stats();
    r.state_out_bytes = s.bytes_out - state_before.bytes_out;
    r.state_in_bytes = s.bytes_in - state_before.bytes_in;
    r.state_wait_ms = s.wait_ms - state_before.wait_ms;
  }
  r.optimizer_ms = seconds_since(optimizer_start) * 1e3;
  ++state_.step;
  if (scaler_) state_.loss_scaler = scaler_->state();
  state_.sampler = sampler_.position();
  state_.seed_counter = interp_.seed_counter();
  r.ms = seconds_since(start) * 1e3;
  r.optimizer_peak_bytes = device_peak_bytes();
  r.mem_peak_bytes = std::max(r.forward_backward_peak_bytes, r.optimizer_peak_bytes);
  const MemoryStats& after = memory_.stats();
  r.evictions = after.evictions - before.evictions;
  r.recomputations = after.recomputations - before.recomputations;
  r.recompute_ms = after.recompute_ms - before.recompute_ms;
  r.fragmentation = after.fragmentation_at_peak;
  if (const SwapStats* swap = memory_.swap_stats()) {
    r.swap_out_bytes = swap->bytes_out - swap_before.bytes_out;
    r.swap_in_bytes = swap->bytes_in - swap_before.bytes_in;
    r.swap_in_hidden_bytes = swap->bytes_in_hidden - swap_before.bytes_in_hidden;
    r.swap_wait_ms = swap->wait_ms - swap_before.wait_ms;
    r.host_peak_bytes = swap->peak_host_bytes;
  }
  if (pipeline_) gather_stage_stats(r);
  trace_step_ended();
  if (interp_.op_time_log() != nullptr) add_time_by_op();
  return r;
}

Trainer::StepMeasurement Trainer::measure_step() {
  StepMeasurement m;
  m.in_use_before = arena_ ? arena_->stats().in_use : 0;
  const StepResult r = train_step();
  m.step_ms = r.ms;
  m.forward_backward_ms = r.forward_backward_ms;
  m.optimizer_ms = r.optimizer_ms;
  m.peak_bytes = arena_ ? r.mem_peak_bytes : -1;
  m.forward_backward_peak_bytes = arena_ ? r.forward_backward_peak_bytes : -1;
  m.optimizer_peak_bytes = arena_ ? r.optimizer_peak_bytes : -1;
  return m;
}

TrainResult Trainer::run(RunOutput* output) {
  output_ = output;
  const auto start = std::chrono::steady_clock::now();
  const int64_t first = state_.step;
  StepResult last;
  while (state_.step < total_steps_) {
    last = train_step();
    result_.final_loss = last.loss;
    result_.mem_peak_bytes = std::max(result_.mem_peak_bytes, last.mem_peak_bytes);
    if (!std::isfinite(last.loss)) {
      progress_.line("warning: loss is " + std::to_string(last.loss) + " at step " + std::to_string(state_.step) +
                     "; try a lower training.lr or training.grad_clip");
    }
    if (last.skipped) {
      progress_.line("step " + std::to_string(state_.step) + " skipped: a gradient was inf or NaN; loss scale now " +
                     std::to_string(scaler_->scale()));
    }
    progress_.step(state_.step, last.loss, last.lr, config_.training.global_batch_size / (last.ms / 1e3));
    if (state_.step % config_.metrics.log_interval == 0 || state_.step == total_steps_) {
      if (replicas_.size() > 1) gather_replica_stats(last);
      log_step(last);
    }
    if (eval_due()) log_eval(evaluate());
    const int64_t every = config_.checkpoint.interval;
    const bool due = every > 0 && (state_.step % every == 0 || state_.step == total_steps_);
    if (due) save_checkpoint();
    if (const int signal = agreed_stop_signal()) {
      if (!due) save_checkpoint();
      // No rank ends before the checkpoint is written: mpirun ends the whole job when one does.
      replicas_.group().barrier("the checkpoint before stopping");
      if (pipeline_) pipeline_->group().barrier("the checkpoint before stopping");
      if (tensor_) tensor_->communicator().barrier("the checkpoint before stopping");
      result_.stopped_by = signal;
      break;
    }
  }
  progress_.finish();
  if (op_steps_ > 0) log_time_by_op();
  result_.steps = state_.step;
  result_.seconds = seconds_since(start);
  result_.samples = (state_.step - first) * config_.training.global_batch_size;
  return result_;
}

int Trainer::agreed_stop_signal() {
  const int mine = StopSignals::received();
  if (replicas_.size() == 1 && !pipeline_ && !tensor_) return mine;
  // [ranks that received one, the sum of their signals], summed over the replicas of this stage,
  // then over the stages: every rank of the job sees the same sums.
  at::Tensor votes;
  {
    HostAllocationScope host;  // a collective's buffer, not device memory
    votes = at::tensor({mine != 0 ? 1.0f : 0.0f, static_cast<float>(mine)});
  }
  replicas_.group().allreduce_sum(votes, "the stop request");
  if (pipeline_) pipeline_->group().allreduce_sum(votes, "the stop request");
  if (tensor_) tensor_->communicator().allreduce_sum(votes, "the stop request");
  const float ranks = votes[0].item<float>();
  if (ranks == 0) return 0;
  return mine != 0 ? mine : static_cast<int>(std::lround(votes[1].item<float>() / ranks));
}

bool Trainer::eval_due() const {
  if (state_.step == total_steps_) return true;
  const int64_t every = config_.training.eval_interval;
  if (every > 0) return state_.step % every == 0;
  return state_.step % sampler_.batches_per_epoch() == 0;  // end of an epoch
}

}  // namespace ht

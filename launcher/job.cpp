#include "launcher/job.h"

#include "launcher/config/config_text.h"
#include "launcher/config/run_plan_of.h"
#include "launcher/data/dataset.h"
#include "launcher/device_group.h"
#include "launcher/export/hf_checkpoint.h"
#include "launcher/model_factory.h"
#include "launcher/planning/first_step_plan.h"
#include "launcher/planning/model_size.h"
#include "launcher/planning/run_check.h"
#include "launcher/report/html_report.h"
#include "training/run_output.h"
#include "training/checkpoint.h"
#include "launcher/device_group.h"
#include "training/stop_signals.h"
#include "training/trainer_parts.h"
#include "base/user_error.h"
#include "alloc/byte_size.h"
#include "alloc/cpu_arena.h"
#include "alloc/cpu_device_allocator.h"
#include "alloc/cuda_arena.h"
#include "runtime/determinism.h"
#include "runtime/thread_pools.h"

#include <cstdio>

namespace ht {
namespace {

void print_plan(const Config& c, const RunPlan& plan, const DataInfo& data, int64_t parameters,
                const Trainer& trainer, const ProcessGrid& grid, const ThreadPools& threads) {
  std::printf("data: %s\n", data.description.c_str());
  if (grid.world > 1) {
    const std::string tensor = (grid.context_parallel == 1 ? std::string() :
        " x context-parallel " + std::to_string(grid.context_parallel)) + (grid.tensor_parallel == 1 ? std::string() :
        " x tensor-parallel " + std::to_string(grid.tensor_parallel) +
            (c.parallel.sequence_parallel ? " with sequence parallelism" : ""));
    std::printf("ranks: %d (data-parallel %d%s x pipeline %d) over %s; each %s %lld samples of a global batch\n",
                grid.world, grid.data_parallel, tensor.c_str(), grid.pipeline_parallel,
                grid.data_parallel_group->backend().c_str(), grid.tensor_parallel == 1 && grid.context_parallel == 1 ? "trains" : "replica trains",
                static_cast<long long>(plan.batch.local()));
  }
  std::printf("model: %s, %lld parameters, on %s, threads %s\n", choice_name(c.model.name),
              static_cast<long long>(parameters), plan.device.c_str(), threads.describe().c_str());
  for (const std::string& line : trainer.description()) std::printf("%s\n", line.c_str());
  std::printf("training: %lld steps (%lld per epoch), global batch %lld in %lld micro-batch(es) of %lld, "
              "%s lr %g (%s)\n",
              static_cast<long long>(trainer.total_steps()), static_cast<long long>(trainer.steps_per_epoch()),
              static_cast<long long>(plan.batch.global), static_cast<long long>(plan.batch.micro_batches),
              static_cast<long long>(plan.batch.micro), choice_name(c.training.optimizer), c.training.lr,
              choice_name(c.training.schedule));
}

JsonObject summary_of(const Config& c, const RunPlan& plan, int64_t model_parameters, const TrainResult& r,
                      const RunPrediction& p) {
  JsonObject s;
  s.add("job", c.job.name).add("config", c.source).add("model", std::string(choice_name(c.model.name)))
      .add("parameters", model_parameters).add("device", plan.device).add("steps", r.steps)
      .add("resumed_from_step", r.resumed_from_step).add("steps_run", r.steps - r.resumed_from_step).add("final_loss", r.final_loss)
      .add("stopped_by", std::string(r.stopped_by != 0 ? signal_name(r.stopped_by) : ""))
      .add("mem_peak_bytes", r.mem_peak_bytes >= 0 ? std::optional<int64_t>(r.mem_peak_bytes) : std::nullopt)
      .add("predicted_peak_bytes", p.prediction.peak_bytes >= 0 ? std::optional<int64_t>(p.prediction.peak_bytes) : std::nullopt)
      .add("predicted_step_ms", p.prediction.step_ms >= 0 ? std::optional<double>(p.prediction.step_ms) : std::nullopt)
      .add("wall_s", r.seconds)
      .add("samples_per_s", r.seconds > 0 ? static_cast<double>(r.samples) / r.seconds : 0.0);
  if (plan.loop.checkpoint_async && p.prediction.checkpoint_host_bytes > 0) {
    s.add("predicted_checkpoint_host_bytes", p.prediction.checkpoint_host_bytes);
  }
  if (plan.memory.uses_host_link()) {
    s.add("predicted_swap_out_bytes", p.prediction.swap_out_bytes).add("predicted_swap_link_ms", p.prediction.swap_link_ms)
        .add("predicted_swap_exposed_ms", p.prediction.swap_exposed_ms);
  }
  if (r.eval) {
    s.add("eval_loss", r.eval->loss);
    if (r.eval->accuracy) s.add("eval_accuracy", *r.eval->accuracy);
    if (r.eval->perplexity) s.add("eval_perplexity", *r.eval->perplexity);
    if (r.eval->bits_per_byte) s.add("eval_bits_per_byte", *r.eval->bits_per_byte);
  }
  return s;
}

// memory.budget as the run has it: the config's words, or the bytes the planner set.
std::string budget_text(const Config& c, const RunPlan& plan) {
  const int64_t bytes = plan.memory.budget_bytes;
  const std::string words = bytes == budget_bytes_of(c) ? c.memory.budget : std::to_string(bytes);
  return c.source + ": memory.budget = \"" + words + "\" (" + format_bytes(bytes) + ")";
}

// The model's own state (parameters, the gradients' block) does not fit: nothing to evict yet.
UserError parameters_do_not_fit(const Config& c, const RunPlan& plan, const DataInfo& data) {
  int64_t bytes = 0;
  {
    HostAllocationScope host;  // a copy just to count, outside the budget
    for (const at::Tensor& p : make_model(c, data)->parameters()) bytes += static_cast<int64_t>(p.nbytes());
  }
  return UserError(budget_text(c, plan) + " cannot hold the model's parameters and their gradients (" +
                   format_bytes(2 * bytes) + "); a budget holds parameters, gradients "
                   "and optimizer state (about 3x the "
                   "parameters with SGD and momentum, 4x with AdamW) plus activations: raise memory.budget or "
                   "train a smaller model");
}

// An op could not get memory even after evicting everything evictable.
// `channels_last`: the model's convolution weights are channels-last.
UserError budget_too_small(const Config& c, const RunPlan& plan, const OutOfBudget& e, const Trainer& trainer,
                           bool channels_last) {
  const MemoryStats& m = trainer.memory().stats();
  const int64_t need = CpuArena::rounded_size(static_cast<size_t>(e.requested));
  std::string text = budget_text(c, plan) + " is too small for model " + choice_name(c.model.name) +
                     " at micro-batch " + std::to_string(plan.batch.micro) + ": in step " + std::to_string(trainer.state().step + 1) +
                     " an allocation of " + format_bytes(need) + " found no room beside the " + format_bytes(e.in_use) +
                     " held by what cannot be evicted (parameters, gradients, optimizer state, the batch and the "
                     "tensors the op reads)";
  if (e.in_use + need > e.capacity) {
    const int64_t at_least = std::max(m.min_budget_bytes, e.in_use + need);
    text += ": " + format_bytes(e.in_use + need) + ", more than the budget; no budget below " + format_bytes(at_least) +
            " can work (measured up to this op; later ops may need more)";
  } else {
    text += ", which left " + format_bytes(e.capacity - e.in_use) + " free, but in pieces, the largest " +
            format_bytes(e.largest_free) + ": fragmentation";
  }
  text += !evicts(plan.memory.policy)
              ? ". Use memory.policy = \"dtr\" to evict and recompute activations, raise memory.budget, or lower "
                "training.micro_batch_size"
              : ". Raise memory.budget (each MiB above the minimum means less recomputation) or lower "
                "training.micro_batch_size (gradients accumulate to the same global batch)";
  if (channels_last) {
    text += "; with a budget near the minimum, training.channels_last = false can help: channels-last convolutions "
            "need temporaries the size of a weight, which fragment a small budget";
  }
  return UserError(text);
}

// The checkpoint folder to resume from, if any, warning about what was skipped (once per job: the
// root rank says it).
std::optional<std::string> resume_point(const Config& config, bool root) {
  std::vector<std::string> warnings;
  const auto resume = resolve_resume(config.checkpoint.resume, config.checkpoint_dir(), warnings);
  if (!root) return resume;
  for (const std::string& w : warnings) std::fprintf(stderr, "hybrid_train: warning: %s\n", w.c_str());
  if (config.checkpoint.resume == "latest" && !resume) {
    std::fprintf(stderr, "hybrid_train: warning: checkpoint.resume = \"latest\" but %s holds no checkpoint; "
                 "starting from step 0\n", config.checkpoint_dir().c_str());
  }
  return resume;
}

// The summary file and the closing line.
void report(const Config& config, const RunPlan& plan, int64_t model_parameters, const TrainResult& result,
            const RunPrediction& predicted, RunOutput& output) {
  output.summary(summary_of(config, plan, model_parameters, result, predicted));
  try {
    write_html_report(config.job.output_dir);
  } catch (const std::exception& e) {  // the run itself went well: say so, and what is missing
    std::fprintf(stderr, "hybrid_train: warning: no report.html: %s\n", e.what());
  }
  if (result.stopped_by != 0) {
    std::printf("stopped by %s after step %lld (%.0f s, loss %.4f): checkpoint in %s; resume with the same command "
                "and --checkpoint.resume=latest\n",
                signal_name(result.stopped_by), static_cast<long long>(result.steps), result.seconds,
                result.final_loss, config.checkpoint_dir().c_str());
    return;
  }
  // The steps this run trained: a resumed run's began after its checkpoint's step.
  const long long ran = static_cast<long long>(result.steps - result.resumed_from_step);
  if (result.resumed_from_step > 0) {
    std::printf("done: %lld steps (%lld to %lld, resumed from step %lld) in %.0f s, final loss %.4f", ran,
                static_cast<long long>(result.resumed_from_step + 1), static_cast<long long>(result.steps),
                static_cast<long long>(result.resumed_from_step), result.seconds, result.final_loss);
  } else {
    std::printf("done: %lld steps in %.0f s, final loss %.4f", ran, result.seconds, result.final_loss);
  }
  if (result.eval && result.eval->accuracy) std::printf(", eval accuracy %.4f", *result.eval->accuracy);
  if (result.eval && result.eval->perplexity) std::printf(", eval perplexity %.3f", *result.eval->perplexity);
  if (result.eval && result.eval->bits_per_byte) std::printf(" (%.3f bits per byte)", *result.eval->bits_per_byte);
  std::printf("; outputs in %s\n", config.job.output_dir.c_str());
}

// Device memory: with a budget, every tensor from here on (parameters, gradients, optimizer state,
// batches, activations) comes from an arena of that size. The datasets stay host. On a GPU the
// arena is one cudaMalloc block that hybrid_train's CUDA allocator serves from
// (alloc/cuda_arena.h); without a budget, ATen's caching allocator serves as ever. A CPU rank
// without a budget counts the same tensors as its device memory (DeviceMemoryScope), so that its
// measured peak means the bytes the planner predicts, with or without a budget.
struct DeviceMemory {
  DeviceMemory(const Config& config, const RunPlan& plan) {
    const at::Device device(plan.device);
    if (plan.memory.budget_bytes > 0) {
      if (device.is_cuda()) {
        install_cuda_allocator();  // before anything allocates on the GPU
        try {
          arena = make_cuda_arena(plan.memory.budget_bytes, device.has_index() ? device.index() : 0);
        } catch (const std::runtime_error& e) {
          throw UserError(budget_text(config, plan) + ": " + e.what() + "; use a smaller memory.budget");
        }
        gpu.emplace(arena);
      } else {
        arena = std::make_shared<CpuArena>(plan.memory.budget_bytes);
        cpu.emplace(arena);
      }
    } else if (device.is_cpu()) {
      unbudgeted.emplace();
    }
  }
  std::shared_ptr<CpuArena> arena;
  std::optional<ArenaScope> cpu;
  std::optional<DeviceMemoryScope> unbudgeted;
  std::optional<CudaArenaScope> gpu;
};

// The model, initialized (from a Hugging Face checkpoint if model.init_from says so) and moved to
// the device. A pipeline stage builds the whole model (the seed's order of initialization) on host
// memory and keeps only its own share in device memory (PipelineStage::keep_only_own); so does a
// rank whose parameters are sharded (ParameterShards keeps its share of each bucket), and a
// tensor-parallel rank with its parts (each layer keeps its part as it makes it, one whole tensor
// at a time).
std::shared_ptr<Model> build_model(const Config& config, const RunPlan& plan, const DataInfo& info, bool root,
                                   bool& channels_last) {
  std::optional<HostAllocationScope> whole_model_on_host;
  const bool shards_parameters = plan.sync.shard == ShardLevel::kParameters || shards_masters(plan);
  const bool splits = plan.grid.tensor > 1;
  if (plan.grid.pipeline > 1 || shards_parameters || splits) whole_model_on_host.emplace();
  std::shared_ptr<Model> model = make_model(config, info, plan.grid.tensor_rank, plan.grid.context_rank);
  for (const std::string& w : initialize_from_hf(*model, config, decoder_options(config.model, info.classes))) {
    if (root) std::fprintf(stderr, "hybrid_train: warning: %s\n", w.c_str());
  }
  model->move_to(at::Device(plan.device), at::kFloat);
  if (plan.channels_last) channels_last = model->use_channels_last() > 0;
  whole_model_on_host.reset();
  if (splits && plan.grid.pipeline == 1 && !shards_parameters) {
    // The part into device memory (the budget's arena); stages and sharded parameters move theirs.
    at::NoGradGuard no_grad;
    for (at::Tensor& p : model->parameters()) p.set_data(p.detach().clone());
    for (at::Tensor& b : model->buffers()) b.set_data(b.detach().clone());
  }
  return model;
}

// The whole model's parameters, whatever part of it this rank holds: a decoder's from its shape
// (a tensor-parallel rank holds a part of most matrices and all of the norms; a pipeline stage its
// layers), another model's as the sum of its pipeline stages' (it has no tensor-parallel split).
int64_t whole_model_parameters(const Config& c, const DataInfo& info, const Model& model, const ProcessGrid& grid) {
  if (is_decoder(c.model.name)) return decoder_options(c.model, info.classes).parameter_count();
  const int64_t own = model.num_parameters();
  if (grid.pipeline_parallel == 1) return own;
  at::Tensor count = at::full({1}, static_cast<double>(own), at::TensorOptions().dtype(at::kDouble));
  grid.pipeline_group->allreduce_sum(count, "the model's parameter count");
  return static_cast<int64_t>(count.item<double>());
}

}  // namespace

JobOutcome run_job(const Config& config, bool quiet, const ProcessGrid* grid) {
  const ProcessGrid single;
  if (grid == nullptr) grid = &single;
  const bool root = grid->is_root();
  // How this rank runs, as the config says it (the replicas checked against the grid's), until the
  // planner's automatic choices below; then read only.
  std::vector<std::string> warnings;
  RunPlan resolving = run_plan_of(config, *grid, &warnings);
  if (root && !quiet) {
    for (const std::string& w : warnings) std::fprintf(stderr, "hybrid_train: warning: %s\n", w.c_str());
  }
  // On GPUs: NCCL between the ranks' GPUs (before anything touches the GPU).
  const std::shared_ptr<Communicator> replicas = replica_group_for_device(resolving, *grid);
  const std::shared_ptr<Communicator> tensor = tensor_group_for_device(resolving, *grid);
  const std::shared_ptr<Communicator> pipeline = pipeline_group_for_device(resolving, *grid);
  const std::shared_ptr<Communicator> context = context_group_for_device(resolving, *grid);
  resolving.pipeline.posting_order = !pipeline->matches_by_tag();  // what the run check prices
  if (resolving.device != "cpu") use_deterministic_cuda_kernels();  // before any kernel runs
  CpuAllocationCounter::install();
  set_host_memory_caching(resolving.memory.host_cache);

  // Everything that can fail on bad input happens before anything is written: the data, then the
  // prediction of this run's peak (a run that cannot fit is refused here, not at its first OOM).
  // The ranks ZeRO shards the state over: every replica's context ranks.
  const RankShare share{resolving.memory.budget_bytes, resolving.batch.micro, resolving.grid.data * resolving.grid.context,
                        resolving.device};
  if (config.model.vocab_size > 0) {
    refuse_a_model_too_large_here(config, share, config.model.vocab_size, grid->local_size, "train");
  }
  DataSplits data = make_datasets(config, root && !quiet);  // token files: one rank shows their check
  const DataInfo info = data.info;
  refuse_a_model_too_large_here(config, share, info.classes, grid->local_size, "train");
  const RunPrediction predicted = check_run_fits(config, resolving, data, *grid);
  const RunPlan plan = std::move(resolving);
  // Every pool a rank computes with gets the same count; by default the ranks on a host share
  // its hardware threads (libtorch's own default, physical cores, ignores both OpenBLAS and them).
  const ThreadPools threads = set_compute_threads(config.training.threads > 0
                                                      ? static_cast<int>(config.training.threads)
                                                      : default_thread_count(grid->local_size));
  DeviceMemory memory(config, plan);
  at::manual_seed(static_cast<int64_t>(plan.seed));
  std::shared_ptr<Model> model;
  bool channels_last = false;  // some weights were restrided
  try {
    model = build_model(config, plan, info, root, channels_last);
  } catch (const OutOfBudget&) {
    throw parameters_do_not_fit(config, plan, info);
  }
  const int64_t parameters = whole_model_parameters(config, info, *model, *grid);
  const std::optional<std::string> resume = resume_point(config, root);
  std::unique_ptr<Trainer> made;
  try {
    made = Trainer::make(plan, std::move(data), model, memory.arena, {replicas, pipeline, tensor, context});
  } catch (const OutOfBudget&) {
    throw parameters_do_not_fit(config, plan, info);  // the gradients' block
  }
  Trainer& trainer = *made;
  if (resume) trainer.resume_from(*resume);
  trainer.set_prediction(predicted.prediction.peak_bytes, predicted.prediction.step_ms);
  const std::string first_plan = plan_first_step(config, plan, info, *model, trainer.memory());

  const Config as_run = config_as_run(config, plan);
  if (!quiet && root) {
    std::printf("hybrid_train %s: job \"%s\" from %s; set there or on the command line (every key: %s/config.resolved.toml):\n%s\n",
                HT_VERSION, config.job.name.c_str(), config.source.c_str(), config.job.output_dir.c_str(),
                config_changes_text(as_run).c_str());
    print_plan(config, plan, info, parameters, trainer, *grid, threads);
    std::printf("%s\n\n", predicted.text.c_str());
    if (!first_plan.empty()) std::printf("%s\n\n", first_plan.c_str());
    std::fflush(stdout);
  }
  std::optional<RunOutput> output;
  if (root) output.emplace(config.job.output_dir, resolved_toml(as_run), resume.has_value());
  const int64_t first_step = trainer.state().step;
  const StopSignals stop_signals;  // SIGTERM, SIGINT: stop after a step, with a checkpoint
  TrainResult result;
  try {
    result = trainer.run(output ? &*output : nullptr);
  } catch (const OutOfBudget& e) {
    if (trainer.state().step == first_step) {
      trainer.close_trace();
      if (output) output->abandon();
    }
    throw budget_too_small(config, plan, e, trainer, channels_last);
  }
  if (root) report(config, plan, parameters, result, predicted, *output);
  return {model, result};
}

}  // namespace ht

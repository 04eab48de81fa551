#include "training/trainer_parts.h"

#include "alloc/byte_size.h"
#include "alloc/cpu_device_allocator.h"
#include "alloc/cuda_host_link.h"
#include "alloc/gradient_buffer.h"
#include "parallel/collective_queue.h"
#include "training/compact.h"
#include "training/gradient_syncs.h"
#include "training/pipeline_runner.h"
#include "training/pipeline_setup.h"
#include "training/step_checks.h"

#include <algorithm>
#include <cstdio>
#include <optional>

namespace ht {
namespace {

// Sharded parameters are gathered a block at a time: their buckets end where blocks do. So do
// sharded gradients': a bucket's gradient block then lives from its block's first gradient to its
// reduce-scatter, which the planner places along the traced step (planner/shard_terms.h); a bucket
// cut by size alone straddles blocks, and when its own first gradient comes is not in the trace.
std::vector<int> bucket_units(const RunPlan& plan, const Model& model) {
  if (plan.sync.shard < ShardLevel::kGradients) return {};
  return model.parameter_blocks();
}

// The parameters and buffers into one block per dtype (under a budget, and with sharding: then
// the parameters in DataParallel's reduction order first, each bucket one span).
// (set_data keeps each parameter's identity: the optimizer's state, the gradient slots and tied
// uses all key on it.)
void compact_parameters(Engine& e, const DataParallel& replicas, bool in_reduction_order) {
  const std::vector<at::Tensor> params = e.model->parameters();
  std::vector<at::Tensor> state = in_reduction_order ? replicas.reduction_order() : params;
  for (const at::Tensor& p : params) {  // any the reduction leaves out (no gradient) after them
    if (std::none_of(state.begin(), state.end(), [&](const at::Tensor& t) { return t.is_same(p); })) state.push_back(p);
  }
  for (const at::Tensor& b : e.model->buffers()) state.push_back(b);  // batch norm's statistics: among them
  std::vector<at::Tensor> moving;
  for (const at::Tensor& t : state) {
    if (t.numel() > 0 && t.is_non_overlapping_and_dense() && (!e.arena || e.arena->contains(t.data_ptr()))) {
      moving.push_back(t);
    }
  }
  if (moving.empty()) return;
  const std::vector<at::Tensor> host = copies_on_host(moving);
  for (size_t i = 0; i < moving.size(); ++i) moving[i].set_data(host[i]);
  // Sharding needs each bucket's parameters in one piece: one block or none.
  const std::vector<at::Tensor> placed = in_reduction_order ? into_one_block(host, e.device) : back_on_device(host, e.device);
  for (size_t i = 0; i < moving.size(); ++i) moving[i].set_data(placed[i]);
}

// parallel.shard = "parameters", or masters sharded at ZeRO-1/2 (`resident`): each rank keeps its
// share of each bucket; the rest of the state (buffers, parameters without gradients) into one
// block as compact_parameters puts it.
std::shared_ptr<ParameterShards> shard_parameters(const RunPlan& plan, Engine& e, DataParallel& replicas,
                                                  bool tensor_parallel, bool resident,
                                                  std::shared_ptr<CollectiveQueue>& worker) {
  auto shards = std::make_shared<ParameterShards>(replicas.shared_group(), e.model->parameters(), replicas.buckets(),
                                                  e.device);
  e.interp.set_parameter_source(shards.get());
  // Under a budget with eviction the memory manager decides which gathered buckets to drop;
  // otherwise gathers run ahead on a thread that owns the group's collectives while a step runs.
  const bool managed = e.arena != nullptr && evicts(plan.memory.policy);
  shards->set_managed(managed);
  shards->set_resident(resident);
  // Not beside a tensor-parallel group: on CPU ranks its collectives use MPI on the computing
  // thread, and on GPUs its communicator's kernels would run beside the replicas' on two streams,
  // which NCCL does not promise to survive (not yet tried on GPUs); nor at ZeRO-1, whose whole
  // gradients data parallelism all-reduces on a queue of its own.
  const bool all_reduces = plan.sync.shard == ShardLevel::kOptimizer;
  if (!managed && plan.sync.prefetch > 0 && !tensor_parallel && !all_reduces) {
    worker = make_collective_queue(replicas.shared_group());
    if (worker) shards->set_prefetch(worker, static_cast<int>(plan.sync.prefetch));
  }
  shards->set_block_uses(e.model->parameters_read_by_blocks());
  e.model->set_block_listener([&e, s = shards.get()](int block) {
    e.interp.set_block(block);  // tape entries record it: backward prefetches by block
    s->block_begins(block);
    e.memory.block_begins(block);  // memory.policy = "full" drops the block before
  });
  const std::vector<at::Tensor> sharded = replicas.reduction_order();
  std::vector<at::Tensor> rest;
  for (const at::Tensor& p : e.model->parameters()) {
    if (std::none_of(sharded.begin(), sharded.end(), [&](const at::Tensor& t) { return t.is_same(p); })) rest.push_back(p);
  }
  for (const at::Tensor& b : e.model->buffers()) rest.push_back(b);
  std::vector<at::Tensor> moving;
  for (const at::Tensor& t : rest) {
    if (t.numel() > 0 && t.is_non_overlapping_and_dense()) moving.push_back(t);
  }
  if (moving.empty()) return shards;
  const std::vector<at::Tensor> host = copies_on_host(moving);
  for (size_t i = 0; i < moving.size(); ++i) moving[i].set_data(host[i]);
  const std::vector<at::Tensor> placed = back_on_device(host, e.device);
  for (size_t i = 0; i < moving.size(); ++i) moving[i].set_data(placed[i]);
  return shards;
}

// Sharded gradients: each bucket's reduce-scatter runs on the group's queue while backward goes
// on (parallel.overlap), on sharded parameters' prefetch queue where it exists (it owns the group
// then), else on one of its own: a communication stream's on a GPU, a worker thread's on CPU
// ranks. Not where ZeRO-3's gathers run on this thread (no prefetch: under a budget with
// eviction, or parallel.prefetch = 0); nor beside a tensor-parallel group (as for the gathers);
// nor, on a worker thread, in a CUDA budget's arena (NCCL's padded path allocates its temporaries
// on the thread that calls it, while the computing thread allocates in the same arena): a
// communication stream's jobs run on the computing thread.
void overlap_reduce_scatters(const RunPlan& plan, const Engine& e, DataParallel& replicas, GradientShards& shards,
                             bool parameters_sharded, bool tensor_parallel, std::shared_ptr<CollectiveQueue>& worker) {
  const bool on_stream = replicas.group().side_stream() != nullptr;
  const bool overlap = plan.sync.overlap && (on_stream || !(e.arena && e.device.is_cuda()));
  if (!worker && overlap && !parameters_sharded && !tensor_parallel) {
    worker = make_collective_queue(replicas.shared_group());
  }
  if (worker) shards.set_worker(worker);  // the thread that owns the group while a step runs
  shards.set_overlap(overlap);            // without a worker, no effect
}

std::string host_swap_line(const MemoryPlan& m) {
  char line[256];
  std::snprintf(line, sizeof line,
                "host swap: a link of %.1f GB/s each way (memcpy on this host: %.1f GB/s), host memory for copies %s",
                m.host_link_gbps, measure_memcpy_gbps(), format_bytes(m.host_budget_bytes).c_str());
  return line;
}

std::string cuda_host_link_line(const HostLink& link, const MemoryPlan& m) {
  char line[256];
  std::snprintf(line, sizeof line,
                "host link: copy streams each way between pinned host memory and the GPU, measured at %.1f GB/s; "
                "host memory for copies %s",
                link.gbps(), format_bytes(m.host_budget_bytes).c_str());
  return line;
}

// Why parallel.overlap cannot overlap here, if it cannot.
std::optional<std::string> overlap_warning(const RunPlan& plan, const DataParallel& replicas, bool stages,
                                           bool tensor_parallel) {
  if (!plan.sync.overlap || replicas.size() <= 1) return std::nullopt;
  if (stages) {
    return "warning: parallel.overlap: a pipeline stage all-reduces its gradients after the step's last backward "
           "(its point-to-point messages use MPI while backward runs)";
  }
  if (tensor_parallel) {
    return "warning: parallel.overlap: a tensor- or context-parallel rank reduces its gradients on the thread running backward, "
           "after it (sharded gradients: as backward finishes each bucket); its group's collectives use MPI while "
           "backward runs";
  }
  if (!replicas.overlaps()) {
    return "warning: parallel.overlap: this MPI library gives no MPI_THREAD_SERIALIZED; gradients are all-reduced "
           "after backward";
  }
  return std::nullopt;
}

// The groups of the grid's axes. A stage reduces the parameters it trains. Its point-to-point
// messages (a tensor-parallel rank's collectives) come from the main thread while backward runs,
// so its all-reduce waits for the step's end (MPI is initialized for one thread at a time).
std::unique_ptr<RankGroups> make_groups(const RunPlan& plan, const Model& model, const PipelineStage* stage,
                                        const RankCommunicators& comms) {
  // Collectives inside the layers (tensor parallelism's, context parallelism's attention) run on
  // the thread running backward: the replicas' all-reduce may not use MPI from another meanwhile.
  const bool tensor_parallel = comms.tensor != nullptr || comms.context != nullptr;
  auto replicas = std::make_unique<DataParallel>(
      comms.replicas ? comms.replicas : std::make_shared<LocalCommunicator>(),
      stage ? stage->parameters() : model.parameters(), plan.sync.bucket_bytes,
      plan.sync.overlap && !stage && !tensor_parallel, bucket_units(plan, model));
  TORCH_CHECK(replicas->size() == plan.grid.data * plan.grid.context, "make_trainer_parts: a group of ",
              replicas->size(), " ranks for ", plan.grid.data, " replicas of ", plan.grid.context, " context ranks");
  return std::make_unique<RankGroups>(std::move(replicas), stage ? comms.pipeline : nullptr,
                                      comms.tensor ? std::make_unique<TensorGroup>(comms.tensor) : nullptr,
                                      plan.sync.timeout_s,
                                      comms.context ? std::make_unique<TensorGroup>(comms.context) : nullptr);
}

// The engine as the plan runs it: every replica with rank 0's buffers, the interpreter's tensor-
// parallel group and kernel log, host swap's link, the memory manager's policy and its block hooks.
void prepare_engine(const RunPlan& plan, Engine& e, RankGroups& groups, bool stages, std::vector<std::string>& notes) {
  Model& model = *e.model;
  if (TensorGroup* tensor = groups.tensor()) e.interp.set_tensor_parallel(tensor);
  if (TensorGroup* context = groups.context()) e.interp.set_context_parallel(context);
  groups.replicas().broadcast_state(model.buffers());
  model.train();
  if (plan.loop.time_by_op && !stages) e.interp.set_op_time_log(&e.op_times);
  if (plan.memory.uses_host_link() && e.arena) {
    if (plan.device.rfind("cuda", 0) == 0) {  // copy streams at the link's measured rate
      e.host_link = make_cuda_host_link(plan.device.size() > 5 ? std::stoi(plan.device.substr(5)) : 0);
      notes.push_back(cuda_host_link_line(*e.host_link, plan.memory));
    } else {
      e.host_link = std::make_shared<ModelledHostLink>(plan.memory.host_link_gbps);
      notes.push_back(host_swap_line(plan.memory));
    }
  }
  e.memory.configure(memory_options(plan.memory, plan.seed, e.arena, e.host_link, static_cast<int>(model.blocks().size())));
  if (e.memory.static_planner() != nullptr || e.memory.options().checkpoint_blocks > 0) {
    // Segments end at blocks; the capture of a step notes where each began; "full" drops blocks there.
    model.set_block_listener([&e](int block) { e.memory.block_begins(block); });
  }
}

// What the data-parallel replicas split, made: ZeRO-3's parameter shards, ZeRO-2's gradient
// shards, or whole gradients in one block; and the gradient sync over them.
struct SyncLayout {
  std::unique_ptr<GradientSync> sync;
  std::shared_ptr<ParameterShards> parameter_shards;  // ZeRO-3, and ZeRO-1/2's sharded masters
  std::shared_ptr<GradientShards> gradient_shards;    // ZeRO-2 and ZeRO-3
};

SyncLayout lay_out_sync(const RunPlan& plan, Engine& e, RankGroups& groups, std::shared_ptr<PipelineStage> stage) {
  DataParallel& dp = groups.replicas();
  const bool tensor_parallel = groups.exchanges_in_layers();
  const ShardLevel level = plan.sync.shard;  // none with one replica
  SyncLayout out;
  std::shared_ptr<CollectiveQueue> worker;  // sharded parameters' and gradients' collectives while a step runs
  const bool masters = shards_masters(plan);
  // training.gradient_dtype = "bf16": the floating parameters' gradients in 16 bits.
  const std::optional<at::ScalarType> floating = floating_gradient_type(plan.gradient_dtype, plan.precision);
  if (level == ShardLevel::kParameters || masters) {
    out.parameter_shards = shard_parameters(plan, e, dp, tensor_parallel, masters, worker);  // gathered where read
  } else if (e.arena || level != ShardLevel::kNone) {
    compact_parameters(e, dp, level != ShardLevel::kNone);
  }
  if (level >= ShardLevel::kGradients) {
    // Each bucket's block only while backward fills it, then this rank's share of its sum
    // (parallel/gradient_shards.h).
    auto shards = std::make_shared<GradientShards>(dp.shared_group(), e.model->parameters(), dp.buckets(), floating);
    e.gradient_slots = shards;
    e.interp.set_gradient_buffer(shards.get());
    overlap_reduce_scatters(plan, e, dp, *shards, out.parameter_shards != nullptr, tensor_parallel, worker);
    out.gradient_shards = shards;
    out.sync = std::make_unique<ShardedSync>(std::move(shards), out.parameter_shards);
  } else {
    if (e.arena || dp.size() > 1 || floating) {
      // Under a budget, gradients get one block beside the parameters (alloc/gradient_buffer.h).
      // Laid out in the order data parallelism reduces them, each bucket is a span of the block,
      // reduced in place: no copies, and no memory beyond the gradients while backward runs.
      // 16-bit gradients always have one: the block is where their type is chosen.
      auto block = std::make_shared<GradientBuffer>(dp.reduction_order(), floating);
      e.gradients = block.get();
      e.gradient_slots = std::move(block);
      e.interp.set_gradient_buffer(e.gradients);
      dp.use_gradient_buffer(e.gradients);
    }
    out.sync = dp.size() > 1 ? std::unique_ptr<GradientSync>(std::make_unique<AllReduceSync>(dp))
                             : std::make_unique<LocalSync>();
  }
  if (stage) {
    stage->set_gradient_type(floating);
    out.sync = std::make_unique<PipelineSync>(std::move(stage), std::move(out.sync));
  }
  return out;
}

// training.compute_weights: the 16-bit copies the interpreter reads, made once per optimizer step
// and kept (auto: runtime/mixed_precision.h, keeps_weight_copies).
// Under ZeRO-3, and at ZeRO-1/2 with sharded masters, the copies are the shards' (each bucket's
// 16-bit shard, gathered as the fp32 one was: parallel/parameter_shards.h).
void keep_weight_copies(const RunPlan& plan, Engine& e, const std::shared_ptr<ParameterShards>& parameter_shards) {
  if (!keeps_weight_copies(plan.compute_weights, plan.precision, e.arena != nullptr && evicts(plan.memory.policy))) {
    return;
  }
  if (parameter_shards) {
    parameter_shards->keep_copies(*autocast_type(plan.precision));
    e.weight_copies = parameter_shards;
  } else {
    e.weight_copies = std::make_shared<WeightCopies>();
  }
  e.interp.set_compute_weights(e.weight_copies.get());
}

// The optimizer step over the parameters, or over this rank's pieces of them, with the checks
// the layout needs, fp16's scaler, and the state's place.
std::unique_ptr<OptimizerStep> make_optimizer_step(const RunPlan& plan, Engine& e, RankGroups& groups,
                                                   PipelineStage* stage, const SyncLayout& layout) {
  DataParallel& dp = groups.replicas();
  const std::vector<at::Tensor> params = e.model->parameters();
  OptimizerStepParts o;
  o.params = params;
  o.master = params;
  o.checked = params;
  OptimizerShard* shard = nullptr;
  if (plan.sync.shard != ShardLevel::kNone) {
    // DataParallel's parameters, which its buckets index: a pipeline stage's own.
    auto owned = std::make_unique<OptimizerShard>(
        dp.shared_group(), dp.parameters(), dp.buckets(), e.gradients,
        layout.parameter_shards ? &layout.parameter_shards->shards() : nullptr);
    shard = owned.get();
    o.master = shard->pieces();
    // With sharded gradients only the pieces have any: unscaled, checked and clipped there.
    if (layout.gradient_shards) o.checked = shard->pieces();
    o.shard = std::make_unique<ShardedUpdate>(std::move(owned), layout.gradient_shards, layout.parameter_shards);
  }
  o.optimizer = make_optimizer(plan.optimizer, o.master);
  o.copies = e.weight_copies;
  if (stage) o.checks = pipeline_checks(*stage);
  if (layout.gradient_shards) o.checks = shard_checks(*shard, dp.group(), e.device);
  if (TensorGroup* tensor = groups.tensor()) {
    // Each rank holds its parts of the split parameters.
    const bool sharded = layout.gradient_shards != nullptr;
    o.checks = tensor_checks(tensor->communicator(), params, e.model->split_parameters(),
                             stage ? stage->parameters() : params, sharded ? shard : nullptr,
                             sharded ? &dp.group() : nullptr, stage, e.device);
  }
  if (plan.precision == MixedPrecision::kFp16) o.scaler = std::make_unique<LossScaler>(plan.loss_scale);
  if (e.arena) {
    const bool on_host = plan.memory.optimizer_state == StatePlace::kHost && e.host_link;
    auto state = std::make_unique<CompactedState>(on_host ? std::make_unique<StateOffload>(e.host_link) : nullptr);
    state->set_device(e.device);
    o.state = std::move(state);
  }
  return std::make_unique<OptimizerStep>(plan.optimizer, std::move(o));
}

}  // namespace

bool shards_masters(const RunPlan& plan) {
  const bool evicting_budget = plan.memory.budget_bytes > 0 && evicts(plan.memory.policy);
  return shards_masters(plan.sync.shard, plan.grid.data * plan.grid.context, plan.grid.pipeline, evicting_budget,
                        keeps_weight_copies(plan.compute_weights, plan.precision, evicting_budget));
}

TrainerParts make_trainer_parts(const RunPlan& plan, const DataSplits& data, Engine& e, RankCommunicators comms) {
  TrainerParts parts;
  std::shared_ptr<PipelineStage> stage;
  if (plan.grid.pipeline > 1) {
    stage = make_pipeline_stage(plan, data, *e.model, comms.replicas.get(), comms.pipeline, comms.tensor, comms.context);
    parts.description.push_back(describe_pipeline(stage->layout()));
    parts.description.push_back("pipeline messages over " + stage->group().backend() + ": " + describe(stage->posting()));
  }
  parts.groups = make_groups(plan, *e.model, stage.get(), comms);
  prepare_engine(plan, e, *parts.groups, stage != nullptr, parts.notes);
  SyncLayout layout = lay_out_sync(plan, e, *parts.groups, stage);
  keep_weight_copies(plan, e, layout.parameter_shards);
  parts.optimizer = make_optimizer_step(plan, e, *parts.groups, stage.get(), layout);
  parts.sync = std::move(layout.sync);
  parts.state = std::make_unique<ModelState>(*e.model, *parts.optimizer, *parts.groups, e.interp.memory_hooks(),
                                             plan.optimizer, ModelState::Layout{stage, layout.parameter_shards});
  parts.runner = stage ? std::unique_ptr<StepRunner>(std::make_unique<PipelineRunner>(e, plan.batch, stage))
                       : std::make_unique<LocalRunner>(e, plan.batch);
  const bool tensor_parallel = parts.groups->exchanges_in_layers();
  if (auto warning = overlap_warning(plan, parts.groups->replicas(), stage != nullptr, tensor_parallel)) {
    parts.notes.push_back(*warning);
  }
  return parts;
}

}  // namespace ht

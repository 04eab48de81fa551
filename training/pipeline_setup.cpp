// The trainer's side of a pipeline: the blocks' probe, the layout from the config, and the
// whole model a checkpoint sees (training/pipeline_setup.h).
#include "training/pipeline_setup.h"

#include "alloc/cpu_device_allocator.h"
#include "training/optimizer.h"
#include "base/user_error.h"
#include "memory/kernel_observer.h"
#include "memory/memory_manager.h"
#include "parallel/tensor_group.h"
#include "runtime/context_parallel.h"
#include "training/dataset.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <stdexcept>
#include <unordered_map>

namespace ht {
namespace {

// Each kernel's time (measured or modelled), attributed to the block running it: forward kernels
// to the block the probe is in, backward kernels to the block whose forward recorded the op.
class BlockTimes final : public KernelObserver {
 public:
  BlockTimes(size_t blocks, bool modeled) : forward(blocks), backward(blocks), modeled_(modeled) {}
  void enter(int block) { block_ = block; }
  void kernel_begins(const ComputePath&, bool, bool) override { start_ = std::chrono::steady_clock::now(); }
  void kernel_ends(const ComputePath& path, bool recompute, bool backward_kernel) override {
    if (recompute) return;
    const double measured =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
    if (!backward_kernel) {
      owner_[&path] = block_;
      forward[static_cast<size_t>(block_)] += modeled_ ? path.modeled_ms : measured;
      return;
    }
    auto it = owner_.find(&path);
    if (it == owner_.end()) return;  // the loss: not a block
    // Modelled: backward costs twice its forward (two products per one); measured: as timed.
    backward[static_cast<size_t>(it->second)] += modeled_ ? 2 * path.modeled_ms : measured;
  }
  std::vector<double> forward, backward;

 private:
  bool modeled_;
  int block_ = 0;
  std::unordered_map<const ComputePath*, int> owner_;
  std::chrono::steady_clock::time_point start_;
};

// Bytes a parameter costs a stage that trains it: itself, its gradient, the optimizer's state.
int64_t state_bytes_per_parameter_byte(const OptimizerOptions& o) {
  if (o.kind == OptimizerKind::kAdamw) return o.state_dtype == StateDtype::kBf16 ? 3 : 4;
  return o.momentum > 0 ? 3 : 2;
}

}  // namespace

namespace {

// One training-mode forward and backward of `micro` in a fresh interpreter: what each block draws,
// outputs and holds, and (into `times`) what its kernels cost.
BlockProfile probe_once(Model& model, const Batch& micro, const RunPlan& plan, BlockTimes& times,
                        const ProbeGroups& groups) {
  BlockProfile profile;
  profile.micro_batch = micro.input.size(0);
  MemoryManager memory;
  Interpreter interp({}, &memory);
  // A split model's probe runs on every rank of its groups alike.
  interp.set_tensor_parallel(groups.tensor);
  interp.set_context_parallel(groups.context);
  interp.set_autocast(autocast_type(plan.precision));
  interp.set_relu_masks(plan.memory.compress != Compression::kOff);
  memory.set_kernel_observer(&times);
  const int64_t per_byte = state_bytes_per_parameter_byte(plan.optimizer);
  const at::Device device(plan.device);
  Tensor x = interp.input(micro.input.to(device));
  for (size_t b = 0; b < model.blocks().size(); ++b) {
    const auto& block = model.blocks()[b];
    times.enter(static_cast<int>(b));
    const int64_t before = memory.stats().resident_bytes;
    const uint64_t seeds = interp.seed_counter();
    x = block->forward(x);
    BlockCost cost;
    cost.activation_bytes = std::max<int64_t>(0, memory.stats().resident_bytes - before);
    for (const at::Tensor& p : block->parameters()) {
      cost.parameters += p.numel();
      cost.state_bytes += static_cast<int64_t>(p.nbytes()) * per_byte;
    }
    profile.costs.push_back(cost);
    profile.seeds.push_back(interp.seed_counter() - seeds);
    profile.out_sizes.emplace_back(x.sizes().begin(), x.sizes().end());
    profile.out_dtype.push_back(x.value().scalar_type());
  }
  interp.backward(model.loss(x, interp.input(micro.target.to(device))));
  memory.set_kernel_observer(nullptr);
  return profile;
}

void send_now(Communicator& group, const at::Tensor& t, int to, int tag, const std::string& what) {
  group.isend(t.contiguous(), to, tag, what)->wait();
}

void receive_now(Communicator& group, at::Tensor& t, int from, int tag, const std::string& what) {
  group.irecv(t, from, tag, what)->wait();
}

// Above the stage's own tags (parallel/pipeline_stage.cpp, pipeline_reduce.cpp).
constexpr int kGatherTag = (1 << 14) + 2;

}  // namespace

BlockProfile profile_blocks(Model& model, const Batch& micro, const RunPlan& plan, const ProbeGroups& groups) {
  HostAllocationScope host;  // the probe holds a whole micro-batch's activations: not the budget's
  const bool modeled = plan.pipeline.stage_costs == StageCosts::kModeled;
  std::vector<at::Tensor> buffers;
  for (const at::Tensor& b : model.buffers()) buffers.push_back(b.clone());
  // Measured: the median of three probes after a warm-up one (the first pays for first touches).
  const int probes = modeled ? 1 : 4;
  std::vector<BlockTimes> times;
  BlockProfile profile;
  for (int i = 0; i < probes; ++i) {
    times.emplace_back(model.blocks().size(), modeled);
    profile = probe_once(model, micro, plan, times.back(), groups);
  }
  if (!modeled) times.erase(times.begin());
  for (size_t b = 0; b < profile.costs.size(); ++b) {
    std::vector<double> f, w;
    for (const BlockTimes& t : times) {
      f.push_back(t.forward[b]);
      w.push_back(t.backward[b]);
    }
    std::sort(f.begin(), f.end());
    std::sort(w.begin(), w.end());
    profile.costs[b].forward_ms = f[f.size() / 2];
    profile.costs[b].backward_ms = w[w.size() / 2];
  }
  // The probes' gradients and batch-norm statistics are not training's.
  for (const at::Tensor& p : model.parameters()) {
    at::Tensor handle = p;
    handle.mutable_grad() = at::Tensor();
  }
  std::vector<at::Tensor> now = model.buffers();
  for (size_t i = 0; i < now.size(); ++i) now[i].copy_(buffers[i]);
  return profile;
}

void share_block_costs(BlockProfile& profile, Communicator& replicas, Communicator& pipeline, Communicator* tensor) {
  at::Tensor costs = at::empty({static_cast<int64_t>(profile.costs.size()), 2}, at::kDouble);
  for (size_t b = 0; b < profile.costs.size(); ++b) {
    costs[static_cast<int64_t>(b)][0] = profile.costs[b].forward_ms;
    costs[static_cast<int64_t>(b)][1] = profile.costs[b].backward_ms;
  }
  // Rank 0's to stage 0 of every replica, then from stage 0 along each replica's pipeline.
  replicas.broadcast(costs, 0, "the blocks' measured times");
  pipeline.broadcast(costs, 0, "the blocks' measured times");
  // Each tensor-parallel group's first rank has rank 0's by now: its group takes them from it.
  if (tensor != nullptr) tensor->broadcast(costs, 0, "the blocks' measured times");
  for (size_t b = 0; b < profile.costs.size(); ++b) {
    profile.costs[b].forward_ms = costs[static_cast<int64_t>(b)][0].item<double>();
    profile.costs[b].backward_ms = costs[static_cast<int64_t>(b)][1].item<double>();
  }
}

PipelineLayout make_pipeline_layout(const RunPlan& plan, const Model& model, BlockProfile profile) {
  const PipelinePlan& p = plan.pipeline;
  PipelineRequest request;
  request.kind = p.schedule;
  request.shape = ScheduleShape{plan.grid.pipeline, static_cast<int>(plan.batch.micro_batches),
                                static_cast<int>(p.virtual_stages)};
  request.stage_blocks.assign(p.stage_blocks.begin(), p.stage_blocks.end());
  if (!evicts(plan.memory.policy)) request.memory_limit_bytes = plan.memory.budget_bytes;
  request.costs = p.stage_costs;
  const int stages = request.shape.stages * request.shape.virtual_stages;
  if (stages > static_cast<int>(model.blocks().size())) {
    throw UserError(plan.source + ": parallel.pipeline_parallel = " + std::to_string(plan.grid.pipeline) +
                    (p.virtual_stages > 1 ? " x parallel.virtual_stages = " + std::to_string(p.virtual_stages)
                                          : std::string()) +
                    " makes " + std::to_string(stages) + " stages, but the model has " +
                    std::to_string(model.blocks().size()) + " blocks; use at most " +
                    std::to_string(model.blocks().size()) + " stages in all");
  }
  try {
    PipelineLayout layout = lay_out_pipeline(request, model, std::move(profile));
    layout.channels_last = plan.channels_last;
    return layout;
  } catch (const std::invalid_argument& e) {
    throw UserError(plan.source + ": " + (p.stage_blocks.empty() ? "" : "parallel.stage_blocks: ") + e.what());
  }
}

std::shared_ptr<PipelineStage> make_pipeline_stage(const RunPlan& plan, const DataSplits& data, Model& model,
                                                   Communicator* replicas, std::shared_ptr<Communicator> pipeline,
                                                   std::shared_ptr<Communicator> tensor,
                                                   std::shared_ptr<Communicator> context) {
  TORCH_CHECK(pipeline && pipeline->size() == plan.grid.pipeline, "make_pipeline_stage: a pipeline group of ",
              pipeline ? pipeline->size() : 0, " ranks for ", plan.grid.pipeline, " stages");
  // Every rank probes the same blocks with the same data (a context rank its chunks of the same
  // sequences: the stages pass activations of T / c tokens); measured times are rank 0's everywhere.
  const Batch probe = context_part(data.train->slice(0, plan.batch.micro),
                                   ContextLayout{plan.grid.context, plan.grid.context_rank});
  std::optional<TensorGroup> split, sequence;  // the probe of a split model exchanges with its groups
  if (tensor) split.emplace(tensor);
  if (context) sequence.emplace(context);
  BlockProfile profile =
      profile_blocks(model, probe, plan, {split ? &*split : nullptr, sequence ? &*sequence : nullptr});
  if (plan.pipeline.stage_costs == StageCosts::kMeasured) {
    LocalCommunicator alone;
    share_block_costs(profile, replicas ? *replicas : alone, *pipeline, tensor.get());
  }
  PipelineLayout layout = make_pipeline_layout(plan, model, std::move(profile));
  auto stage = std::make_shared<PipelineStage>(model, std::move(layout), std::move(pipeline), at::Device(plan.device));
  stage->keep_only_own(model);
  return stage;
}

void with_full_model(PipelineStage& stage, Model& model, torch::optim::Optimizer& optimizer,
                     const std::function<void()>& fn) {
  at::NoGradGuard no_grad;
  const PipelineStage::Share& share = stage.share();
  const std::vector<at::Tensor> params = model.parameters(), buffers = model.buffers();
  {
    HostAllocationScope host;  // the other stages' tensors are not this stage's device memory
    for (size_t i = 0; i < params.size(); ++i)
      if (!share.own_param[i]) at::Tensor(params[i]).set_data(at::zeros(share.param_sizes[i], params[i].options()));
    for (size_t i = 0; i < buffers.size(); ++i)
      if (!share.own_buffer[i]) at::Tensor(buffers[i]).set_data(at::zeros(share.buffer_sizes[i], buffers[i].options()));
  }
  struct Empty {  // also when fn throws
    const PipelineStage::Share& share;
    const std::vector<at::Tensor>& params;
    const std::vector<at::Tensor>& buffers;
    torch::optim::Optimizer& optimizer;
    ~Empty() {
      for (size_t i = 0; i < params.size(); ++i) {
        if (share.own_param[i]) continue;
        at::Tensor(params[i]).set_data(at::empty({0}, params[i].options()));
        drop_optimizer_state(optimizer, params[i]);
      }
      for (size_t i = 0; i < buffers.size(); ++i)
        if (!share.own_buffer[i]) at::Tensor(buffers[i]).set_data(at::empty({0}, buffers[i].options()));
    }
  } empty{share, params, buffers, optimizer};
  fn();
}

void gather_to_first_stage(PipelineStage& stage, Model& model, torch::optim::Optimizer& optimizer) {
  Communicator& group = stage.group();
  const int rank = stage.rank();
  at::NoGradGuard no_grad;
  const std::vector<at::Tensor> params = model.parameters();
  const std::vector<int> owner = parameter_owners(model, stage.layout());
  for (size_t i = 0; i < params.size(); ++i) {
    const int from = owner[i];
    if (from == 0 || (rank != 0 && rank != from)) continue;
    at::Tensor p = params[i];
    if (rank == from) {
      send_now(group, p, 0, kGatherTag, "a parameter for the checkpoint");
      std::vector<at::Tensor> state = optimizer_state(optimizer, p);
      send_now(group, at::scalar_tensor(static_cast<int64_t>(state.size()), at::kLong), 0, kGatherTag,
               "an optimizer state for the checkpoint");
      for (const at::Tensor& s : state) send_now(group, s, 0, kGatherTag, "an optimizer state for the checkpoint");
      continue;
    }
    at::Tensor value = at::empty_like(p, at::MemoryFormat::Contiguous);
    receive_now(group, value, from, kGatherTag, "a parameter for the checkpoint");
    p.copy_(value);
    at::Tensor count = at::scalar_tensor(0, at::kLong);
    receive_now(group, count, from, kGatherTag, "an optimizer state for the checkpoint");
    if (count.item<int64_t>() == 0) continue;
    std::vector<at::Tensor> state = empty_optimizer_state(optimizer, p);
    TORCH_CHECK(static_cast<int64_t>(state.size()) == count.item<int64_t>(), "pipeline: optimizer states differ");
    for (at::Tensor& s : state) {
      s = s.contiguous();
      receive_now(group, s, from, kGatherTag, "an optimizer state for the checkpoint");
    }
    set_optimizer_state(optimizer, p, state);
  }
  const std::vector<at::Tensor> buffers = model.buffers();
  const std::vector<int> buffer_owner = buffer_owners(model, stage.layout());
  for (size_t i = 0; i < buffers.size(); ++i) {
    const int from = buffer_owner[i];
    if (from == 0 || (rank != 0 && rank != from)) continue;
    at::Tensor b = buffers[i];
    if (rank == from) {
      send_now(group, b, 0, kGatherTag, "a buffer for the checkpoint");
    } else {
      at::Tensor value = at::empty_like(b, at::MemoryFormat::Contiguous);
      receive_now(group, value, from, kGatherTag, "a buffer for the checkpoint");
      b.copy_(value);
    }
  }
}

}  // namespace ht

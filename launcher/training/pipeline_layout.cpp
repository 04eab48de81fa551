#include "launcher/training/pipeline_layout.h"

#include "launcher/user_error.h"
#include "alloc/cpu_device_allocator.h"
#include "memory/kernel_observer.h"
#include "memory/memory_manager.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

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

std::optional<at::ScalarType> autocast_of(const TrainingConfig& t) {
  if (t.mixed_precision == "bf16") return at::kBFloat16;
  if (t.mixed_precision == "fp16") return at::kHalf;
  return std::nullopt;
}

// Bytes a parameter costs a stage that trains it: itself, its gradient, the optimizer's state.
int64_t state_bytes_per_parameter_byte(const TrainingConfig& t) {
  if (t.optimizer == "adamw") return 4;
  return t.momentum > 0 ? 3 : 2;
}

const char* where(const Config& c) { return c.source.c_str(); }

}  // namespace

namespace {

// One training-mode forward and backward of `micro` in a fresh interpreter: what each block draws,
// outputs and holds, and (into `times`) what its kernels cost.
BlockProfile probe_once(Model& model, const Batch& micro, const Config& config, BlockTimes& times) {
  BlockProfile profile;
  profile.micro_batch = micro.input.size(0);
  MemoryManager memory;
  Interpreter interp({}, &memory);
  interp.set_autocast(autocast_of(config.training));
  interp.set_relu_masks(config.memory.compress != "off");
  memory.set_kernel_observer(&times);
  const int64_t per_byte = state_bytes_per_parameter_byte(config.training);
  const at::Device device(config.training.device);
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

}  // namespace

BlockProfile profile_blocks(Model& model, const Batch& micro, const Config& config) {
  HostAllocationScope host;  // the probe holds a whole micro-batch's activations: not the budget's
  const bool modeled = config.parallel.stage_costs == "modeled";
  std::vector<at::Tensor> buffers;
  for (const at::Tensor& b : model.buffers()) buffers.push_back(b.clone());
  // Measured: the median of three probes after a warm-up one (the first pays for first touches).
  const int probes = modeled ? 1 : 4;
  std::vector<BlockTimes> times;
  BlockProfile profile;
  for (int i = 0; i < probes; ++i) {
    times.emplace_back(model.blocks().size(), modeled);
    profile = probe_once(model, micro, config, times.back());
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

void share_block_costs(BlockProfile& profile, Communicator& replicas, Communicator& pipeline) {
  at::Tensor costs = at::empty({static_cast<int64_t>(profile.costs.size()), 2}, at::kDouble);
  for (size_t b = 0; b < profile.costs.size(); ++b) {
    costs[static_cast<int64_t>(b)][0] = profile.costs[b].forward_ms;
    costs[static_cast<int64_t>(b)][1] = profile.costs[b].backward_ms;
  }
  // Rank 0's to stage 0 of every replica, then from stage 0 along each replica's pipeline.
  replicas.broadcast(costs, 0, "the blocks' measured times");
  pipeline.broadcast(costs, 0, "the blocks' measured times");
  for (size_t b = 0; b < profile.costs.size(); ++b) {
    profile.costs[b].forward_ms = costs[static_cast<int64_t>(b)][0].item<double>();
    profile.costs[b].backward_ms = costs[static_cast<int64_t>(b)][1].item<double>();
  }
}

std::vector<int64_t> PipelineLayout::input_sizes(int vs, int64_t n) const {
  std::vector<int64_t> sizes = profile.out_sizes[static_cast<size_t>(blocks_begin(vs) - 1)];
  sizes[0] = n;
  return sizes;
}

at::ScalarType PipelineLayout::input_dtype(int vs) const {
  return profile.out_dtype[static_cast<size_t>(blocks_begin(vs) - 1)];
}

uint64_t PipelineLayout::seeds_before(int block) const {
  uint64_t seeds = 0;
  for (int b = 0; b < block; ++b) seeds += profile.seeds[static_cast<size_t>(b)];
  return seeds;
}

namespace {

// Micro-batches each virtual stage holds at once under the schedule (its rank's peak, shared
// among the rank's chunks), from the schedule's own simulation.
std::vector<int> in_flight_per_virtual_stage(ScheduleKind kind, ScheduleShape shape) {
  const SimulationResult sim = simulate(make_schedule(kind, shape), shape);
  std::vector<int> counts(static_cast<size_t>(shape.stages * shape.virtual_stages), 1);
  for (int vs = 0; vs < static_cast<int>(counts.size()); ++vs) {
    const int peak = sim.peak_in_flight[static_cast<size_t>(rank_of_virtual_stage(vs, shape))];
    counts[static_cast<size_t>(vs)] = std::max(1, (peak + shape.virtual_stages - 1) / shape.virtual_stages);
  }
  return counts;
}

}  // namespace

PipelineLayout make_pipeline_layout(const Config& config, const Model& model, BlockProfile profile) {
  const ParallelConfig& p = config.parallel;
  PipelineLayout layout;
  layout.kind = *schedule_from_name(p.pipeline_schedule);  // the schema admits only these names
  layout.shape = ScheduleShape{static_cast<int>(p.pipeline_parallel), static_cast<int>(config.micro_batches()),
                               static_cast<int>(p.virtual_stages)};
  const int stages = layout.virtual_stages();
  const int blocks = static_cast<int>(model.blocks().size());
  if (stages > blocks) {
    throw UserError(std::string(where(config)) + ": parallel.pipeline_parallel = " +
                    std::to_string(p.pipeline_parallel) + (p.virtual_stages > 1 ? " x parallel.virtual_stages = " +
                    std::to_string(p.virtual_stages) : std::string()) + " makes " + std::to_string(stages) +
                    " stages, but the model has " + std::to_string(blocks) + " blocks; use at most " +
                    std::to_string(blocks) + " stages in all");
  }
  for (size_t b = 0; b < profile.costs.size(); ++b) {
    profile.costs[b].name = model.block_names()[b];
  }
  PartitionOptions options;
  options.stages = stages;
  options.in_flight = in_flight_per_virtual_stage(layout.kind, layout.shape);
  if (config.memory.policy == "none") options.memory_limit_bytes = config.memory.budget_bytes;
  try {
    if (!p.stage_blocks.empty()) {
      layout.partition = partition_from_counts(profile.costs, std::vector<int>(p.stage_blocks.begin(),
                                               p.stage_blocks.end()), options);
    } else {
      layout.partition = balance_stages(profile.costs, options);
    }
  } catch (const std::invalid_argument& e) {
    throw UserError(std::string(where(config)) + ": " + (p.stage_blocks.empty() ? "" : "parallel.stage_blocks: ") +
                    e.what());
  }
  for (const StagePlan& s : layout.partition.stages) layout.first_block.push_back(s.first_block);
  layout.first_block.push_back(blocks);
  layout.profile = std::move(profile);
  layout.costs = p.stage_blocks.empty() ? p.stage_costs : "stage_blocks";
  return layout;
}

std::string describe_pipeline(const PipelineLayout& layout) {
  std::string text = std::string("pipeline: ") + schedule_name(layout.kind) + ", " +
                     std::to_string(layout.shape.stages) + " stages";
  if (layout.shape.virtual_stages > 1) text += " x " + std::to_string(layout.shape.virtual_stages) + " chunks";
  text += ", " + std::to_string(layout.shape.micro_batches) + " micro-batches of " +
          std::to_string(layout.profile.micro_batch) + "; " +
          (layout.costs == "stage_blocks" ? std::string("blocks as parallel.stage_blocks says")
                                          : "blocks balanced by " + layout.costs + " time") + ":\n";
  text += format_stage_table(layout.profile.costs, layout.partition);
  text += "\nblock ms (forward + backward of a micro-batch):";
  for (const BlockCost& c : layout.profile.costs) {
    char block[96];
    std::snprintf(block, sizeof block, " %s %.3f", c.name.c_str(), c.forward_ms + c.backward_ms);
    text += block;
  }
  PartitionOptions options;
  options.stages = layout.virtual_stages();
  const Partition by_params = partition_by_parameters(layout.profile.costs, options);
  char line[160];
  std::snprintf(line, sizeof line, "\n(split by parameter count instead: slowest stage %.2f ms, %.2fx the mean)",
                by_params.slowest_ms, by_params.mean_ms > 0 ? by_params.slowest_ms / by_params.mean_ms : 1.0);
  return text + line;
}

namespace {

int rank_of_block(const PipelineLayout& layout, int block) {
  for (int vs = 0; vs < layout.virtual_stages(); ++vs) {
    if (block < layout.blocks_end(vs)) return rank_of_virtual_stage(vs, layout.shape);
  }
  return rank_of_virtual_stage(layout.virtual_stages() - 1, layout.shape);
}

// Rank of the block registering each tensor (by TensorImpl) that `of` lists.
template <typename Of>
std::vector<int> owners(const Model& model, const PipelineLayout& layout, std::vector<at::Tensor> all, Of of) {
  std::unordered_map<const void*, int> rank;
  const auto& blocks = model.blocks();
  for (size_t b = 0; b < blocks.size(); ++b)
    for (const at::Tensor& t : of(*blocks[b]))
      rank.emplace(t.unsafeGetTensorImpl(), rank_of_block(layout, static_cast<int>(b)));
  std::vector<int> result;
  for (const at::Tensor& t : all) {
    auto it = rank.find(t.unsafeGetTensorImpl());
    result.push_back(it == rank.end() ? 0 : it->second);  // a tensor outside the blocks: rank 0's
  }
  return result;
}

}  // namespace

std::vector<int> parameter_owners(const Model& model, const PipelineLayout& layout) {
  return owners(model, layout, model.parameters(), [](const Block& b) { return b.parameters(); });
}

std::vector<int> buffer_owners(const Model& model, const PipelineLayout& layout) {
  return owners(model, layout, model.buffers(), [](const Block& b) { return b.buffers(); });
}

std::vector<TiedParameter> tied_parameters(const Model& model, const PipelineLayout& layout) {
  const std::vector<at::Tensor> params = model.parameters();
  const std::vector<int> owner = parameter_owners(model, layout);
  std::vector<TiedParameter> tied;
  const auto& blocks = model.blocks();
  for (size_t b = 0; b < blocks.size(); ++b) {
    const int user = rank_of_block(layout, static_cast<int>(b));
    for (const at::Tensor& shared : blocks[b]->shared_parameters()) {
      for (size_t i = 0; i < params.size(); ++i) {
        if (!params[i].is_same(shared) || owner[i] == user) continue;
        tied.push_back(TiedParameter{params[i], owner[i], user});
      }
    }
  }
  return tied;
}

std::vector<at::Tensor> stage_parameters(const Model& model, const PipelineLayout& layout, int rank) {
  const std::vector<at::Tensor> params = model.parameters();
  const std::vector<int> owner = parameter_owners(model, layout);
  std::unordered_set<const void*> used;
  for (const TiedParameter& t : tied_parameters(model, layout))
    if (t.user == rank) used.insert(t.param.unsafeGetTensorImpl());
  std::vector<at::Tensor> mine;
  for (size_t i = 0; i < params.size(); ++i) {
    if (owner[i] == rank || used.count(params[i].unsafeGetTensorImpl())) mine.push_back(params[i]);
  }
  return mine;
}

}  // namespace ht

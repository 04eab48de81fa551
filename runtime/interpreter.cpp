#include "runtime/interpreter.h"

#include "alloc/cpu_device_allocator.h"
#include "runtime/kernel_cost.h"
#include "runtime/kernel_timer.h"

#include <ATen/core/grad_mode.h>

#include <cstdio>

namespace ht {

Interpreter::Interpreter(InterpreterOptions options, MemoryHooks* memory)
    : options_(options), memory_(memory != nullptr ? memory : &no_memory_) {
  memory_->bind(this);
}

Interpreter::~Interpreter() {
  tape_.clear();
  clear_cast_cache();
  memory_->bind(nullptr);
  if (live_records_ != 0) {
    // Handles that outlive their interpreter would point at freed memory: a programming error.
    std::fprintf(stderr, "hybrid_train: internal error: %lld tensor records outlive their interpreter\n",
                 static_cast<long long>(live_records_));
  }
}

std::shared_ptr<TensorInfo> Interpreter::new_record(const at::Tensor& value) {
  auto info = std::make_shared<TensorInfo>(this, next_id_++);
  ++live_records_;
  info->sizes.assign(value.sizes().begin(), value.sizes().end());
  info->dtype = value.scalar_type();
  info->device = value.device();
  return info;
}

Tensor Interpreter::make_leaf(const at::Tensor& value, bool requires_grad) {
  TORCH_CHECK(value.defined(), "Interpreter: a leaf needs a defined at::Tensor");
  auto info = new_record(value);
  info->is_leaf = true;
  info->requires_grad = requires_grad && grad_enabled_;
  info->nbytes = value.has_storage() ? static_cast<int64_t>(value.storage().nbytes()) : 0;
  info->value = value;
  info->residency = Residency::kResident;
  return Tensor(std::move(info));
}

Tensor Interpreter::input(const at::Tensor& value) { return make_leaf(value, false); }

Tensor Interpreter::param(const at::Tensor& value) {
  Tensor t = make_leaf(value, value.requires_grad());
  t.info()->is_weight = true;
  return t;
}

Tensor Interpreter::stage_input(const at::Tensor& value) {
  TORCH_CHECK(!value.requires_grad(), "stage_input: the received activation is plain data, not a parameter");
  return make_leaf(value, /*requires_grad=*/true);
}

Tape Interpreter::take_tape() {
  // A weight's low-precision copy made in this forward is recorded on the tape taken here; a
  // later forward must make its own, or its gradient would reach the copy after this tape's
  // cast entry has run.
  clear_cast_cache();
  return tape_.take();
}

void Interpreter::backward(Tape& tape, const std::vector<Tensor>& roots, const std::vector<at::Tensor>& grads,
                           BackwardPart part) {
  TORCH_CHECK(options_.mode == ExecutionMode::kInterpreted, "backward of a taken tape: interpreted mode only");
  tape.backward(*this, roots, grads, part);
}

uint64_t Interpreter::next_seed() {
  // splitmix64 over (seed, counter): independent, reproducible seeds.
  auto mix = [](uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  const uint64_t z = mix(options_.seed + 0x9E3779B97F4A7C15ull * (++seed_counter_));
  return seed_stream_ == 0 ? z : mix(z + 0x9E3779B97F4A7C15ull * seed_stream_);
}

std::vector<Tensor> Interpreter::apply(std::shared_ptr<const Op> op,
                                       const std::vector<Tensor>& inputs) {
  if (autocast_) {
    const std::vector<Tensor> cast = autocast_inputs(*op, inputs);
    if (!cast.empty()) return apply(std::move(op), cast);  // now in the op's types: no second cast
    if (op->traits().precision == Precision::kLowOutput) return autocast_outputs(run(std::move(op), inputs));
  }
  return run(std::move(op), inputs);
}

std::vector<Tensor> Interpreter::run(std::shared_ptr<const Op> op, const std::vector<Tensor>& inputs) {
  if (options_.mode == ExecutionMode::kAutograd) return apply_autograd(std::move(op), inputs);
  const OpTraits& traits = op->traits();
  TORCH_CHECK(!traits.in_place, "op ", traits.name,
              " writes in place: the interpreter runs functional ops only");

  std::vector<std::shared_ptr<TensorInfo>> in_infos;
  in_infos.reserve(inputs.size());
  bool any_input_requires_grad = false;
  for (const Tensor& in : inputs) {
    TORCH_CHECK(in.defined(), "op ", traits.name, ": undefined input");
    TORCH_CHECK(in.info()->owner == this, "op ", traits.name, ": input from another interpreter");
    any_input_requires_grad |= in.requires_grad();
    in_infos.push_back(in.info_ptr());
  }
  auto path = std::make_shared<ComputePath>(std::move(op), std::move(in_infos));

  // Pin every input first, so that regenerating one cannot make room by dropping another.
  for (auto& in : path->inputs) ++in->pin_count;
  for (auto& in : path->inputs) materialize(*in);
  std::vector<at::Tensor> outs = run_kernel(*path, /*recompute=*/false);
  for (auto& in : path->inputs) --in->pin_count;

  const bool needs_grad = grad_enabled_ && traits.differentiable && any_input_requires_grad;
  std::vector<Tensor> handles;
  handles.reserve(outs.size());
  path->outputs.assign(outs.size(), nullptr);
  for (size_t j = 0; j < outs.size(); ++j) {
    TORCH_CHECK(outs[j].defined(), "op ", traits.name, ": output ", j, " is undefined");
    auto info = new_record(outs[j]);
    info->producer = path;
    info->output_index = static_cast<int>(j);
    info->requires_grad = needs_grad && at::isFloatingType(outs[j].scalar_type());
    path->outputs[j] = info.get();
    link_alias(*info, *path, outs[j], j);
    handles.emplace_back(std::move(info));
    attach(*handles.back().info(), std::move(outs[j]));
  }
  if (needs_grad) tape_.record(path, handles, block_);
  memory_->forward_outputs(*path, handles, needs_grad);
  return handles;
}

std::vector<at::Tensor> Interpreter::run_kernel(ComputePath& path, bool recompute) {
  std::vector<at::Tensor> in_values;
  in_values.reserve(path.inputs.size());
  const uint64_t now = tick();
  // Recomputations read resident inputs without materialize(): a weight among them (sharded
  // parameters) is made resident here, and held until the kernel is done; every input is pinned.
  const ParameterReads reads(parameter_source_);
  if (parameter_source_ != nullptr) {
    for (auto& in : path.inputs) read_weight(*in);
  }
  for (auto& in : path.inputs) {
    TORCH_INTERNAL_ASSERT(in->resident(), "run_kernel: input not resident");
    in->last_access = now;
    in_values.push_back(in->value);
  }
  memory_->before_kernel(path, recompute);
  // Our tape does reverse mode: libtorch must not record a graph of its own.
  at::AutoGradMode no_autograd(false);
  // The host's clock, and on a GPU CUDA events around the kernel where its time is read
  // (runtime/kernel_timer.h). Eviction weighs the modelled cost by default
  // (runtime/kernel_cost.h), which needs no timing.
  KernelTimer timer(in_values.empty() ? at::Device(at::kCPU) : in_values.front().device(),
                    memory_->reads_kernel_times() || op_times_ != nullptr);
  // Evictable: the arena's bottom; a regeneration into the smallest hole that takes it.
  PlacementScope activations(recompute ? Placement::kRecomputed : Placement::kActivation);
  std::vector<at::Tensor> outs = run_with_room(*memory_, [&] {
    timer.start();  // a rerun after making room times itself alone
    auto o = path.op->forward(in_values, ForwardContext{recompute});
    timer.stop();
    return o;
  });
  const double ms = timer.host_ms();
  if (op_times_ != nullptr) {
    op_times_->add(path.op->traits().name, recompute ? OpTimeLog::Pass::kRecompute : OpTimeLog::Pass::kForward, timer);
  }
  if (!recompute) {
    path.compute_ms = ms;
    path.pending_ms = timer.device_time();
    path.work = kernel_work(path.op->traits(), in_values, outs);
    path.modeled_ms = modeled_kernel_ms(path.op->traits(), path.work);
  }
  memory_->after_kernel(path, recompute, ms);
  return outs;
}

void Interpreter::backward(const Tensor& loss) {
  TORCH_CHECK(loss.defined() && loss.numel() == 1,
              "backward(loss): loss must be a scalar; pass explicit gradients otherwise");
  backward({loss}, {at::ones(loss.sizes(), loss.options())});
}

}  // namespace ht

#include "planner/step_recorder.h"

#include "memory/memory_manager.h"
#include "runtime/op.h"
#include "runtime/tensor_info.h"

#include <algorithm>

namespace ht {

StepRecorder::StepRecorder(MemoryManager& memory, int64_t persistent_bytes) : memory_(memory) {
  trace_.persistent_bytes = persistent_bytes;
  set_allocation_observer(this);
  memory_.set_kernel_observer(this);
}

StepRecorder::~StepRecorder() {
  set_allocation_observer(nullptr);
  memory_.set_kernel_observer(nullptr);
}

void StepRecorder::on_allocated(const void* data, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!recording_) return;
  const int index = static_cast<int>(trace_.tensors.size());
  TraceTensor t;
  t.bytes = bytes;
  // While a forward kernel runs, its allocations come from the activation end (PlacementScope).
  t.low_end = kernel_ >= 0 && forward_kernel_;
  trace_.tensors.push_back(t);
  live_[data] = index;
  alive_.push_back(1);
  trace_.events.push_back({TraceEvent::Kind::kAllocated, index});
}

void StepRecorder::on_freed(const void* data, int64_t /*bytes*/) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(data);
  if (!recording_ || it == live_.end()) return;  // allocated before the step: persistent
  trace_.events.push_back({TraceEvent::Kind::kFreed, it->second});
  alive_[static_cast<size_t>(it->second)] = 0;
  live_.erase(it);
}

int StepRecorder::tensor_of(const TensorInfo& t) const {
  const TensorInfo& root = t.base != nullptr ? *t.base : t;
  if (!root.value.defined() || !root.value.has_storage()) return -1;
  auto it = live_.find(root.value.storage().data());
  return it == live_.end() ? -1 : it->second;
}

void StepRecorder::add_input(std::vector<int>& inputs, const TensorInfo& t) const {
  const int index = tensor_of(t);
  if (index >= 0 && std::find(inputs.begin(), inputs.end(), index) == inputs.end()) inputs.push_back(index);
}

// A kernel's work; a backward's from its forward's: a contraction or a convolution makes the
// gradients of both operands (two contractions of its own size); attention's backward recomputes
// the scores a block at a time and makes three gradients (five contractions to forward's two, as
// FlashAttention's backward); a memory-bound op reads the output's gradient and what it saved
// and writes the inputs' gradients, about twice what forward moved; a cast's backward is a cast
// back, what forward moved (measured on an H200, docs/gpu.md); add's hands the gradient on,
// nothing unless an input was broadcast (then one read of it); a view whose backward writes its
// input's gradient (slice, split) reads and writes that many bytes.
void set_kernel_work(TraceKernel& k, const OpTraits& traits, const KernelWork& forward, bool backward) {
  k.type = forward.dtype == at::kBFloat16 ? KernelType::kBf16 : forward.dtype == at::kHalf ? KernelType::kFp16 : KernelType::kFloat;
  k.flops = forward.flops;
  k.bytes = forward.bytes;
  k.attention_length = forward.attention_length;
  k.misaligned = forward.misaligned;
  k.converts = forward.converts;
  if (!backward) return;
  if (forward.views_only && traits.backward_writes_input) {
    k.bytes = 2.0 * forward.input_bytes;
    return;
  }
  if (traits.backward_passes_gradient) {
    k.bytes = forward.broadcasts ? forward.bytes / 3.0 : 0.0;  // forward read two and wrote one
    return;
  }
  if (forward.converts) return;
  const bool attention = traits.work == Work::kAttention || traits.work == Work::kCausalAttention;
  k.flops *= attention ? 2.5 : 2.0;
  k.bytes *= 2.0;
}

void StepRecorder::kernel_begins(const ComputePath& path, bool recompute, bool backward) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!recording_ || recompute) return;  // profiled steps run without eviction: no recomputation
  const OpTraits& traits = path.op->traits();
  TraceKernel k;
  k.op = traits.name;
  k.backward = backward;
  k.recomputable = traits.recomputable;
  k.heavy = traits.work != Work::kMemory;
  for (size_t i = 0; i < path.inputs.size(); ++i) {
    // Backward reads only what the op saved; forward reads every input.
    if (!backward || (traits.saves_inputs & (1u << i))) add_input(k.inputs, *path.inputs[i]);
    const TensorInfo& in = *path.inputs[i];
    if (backward && in.is_leaf && in.is_weight && in.requires_grad) {
      auto it = gradient_bucket_of_.find(in.value.unsafeGetTensorImpl());
      const int bucket = it == gradient_bucket_of_.end() ? -1 : static_cast<int>(it->second);
      if (bucket >= 0 && std::find(k.gradient_buckets.begin(), k.gradient_buckets.end(), bucket) == k.gradient_buckets.end()) {
        k.gradient_buckets.push_back(bucket);
      }
    }
  }
  if (backward) {
    for (size_t j = 0; j < path.outputs.size(); ++j) {
      if ((traits.saves_outputs & (1u << j)) && path.outputs[j] != nullptr) add_input(k.inputs, *path.outputs[j]);
    }
  }
  if (backward) {
    auto it = block_of_.find(&path);
    k.block = it == block_of_.end() ? -1 : it->second;
  } else {
    k.block = block_;
    block_of_[&path] = block_;
  }
  kernel_ = static_cast<int>(trace_.kernels.size());
  forward_kernel_ = !backward;
  trace_.kernels.push_back(std::move(k));
  trace_.events.push_back({TraceEvent::Kind::kKernelBegins, kernel_});
  first_tensor_of_kernel_ = trace_.tensors.size();
  kernel_start_ = std::chrono::steady_clock::now();
}

void StepRecorder::kernel_ends(const ComputePath& path, bool recompute, bool /*backward*/) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!recording_ || recompute || kernel_ < 0) return;
  TraceKernel& k = trace_.kernels[static_cast<size_t>(kernel_)];
  k.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - kernel_start_).count();
  if (!k.backward) k.modeled_ms = path.modeled_ms;
  set_kernel_work(k, path.op->traits(), path.work, k.backward);  // forward's work is known once it ran
  // What a forward kernel allocated and still holds is its output: regenerable by running it.
  if (!k.backward) {
    for (size_t i = first_tensor_of_kernel_; i < trace_.tensors.size(); ++i) {
      if (alive_[i]) trace_.tensors[i].producer = kernel_;
    }
  }
  trace_.events.push_back({TraceEvent::Kind::kKernelEnds, kernel_});
  kernel_ = -1;
}

void StepRecorder::enter_block(int block) {
  std::lock_guard<std::mutex> lock(mutex_);
  block_ = block;
}

StepTrace StepRecorder::take() {
  std::lock_guard<std::mutex> lock(mutex_);
  recording_ = false;
  return std::move(trace_);
}

}  // namespace ht

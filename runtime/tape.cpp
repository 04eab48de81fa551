#include "runtime/tape.h"

#include "runtime/interpreter.h"
#include "runtime/kernel_timer.h"
#include "runtime/parameter_source.h"
#include "runtime/widening_add.h"

#include <ATen/core/grad_mode.h>

#include <optional>
#include <unordered_map>

namespace ht {

namespace {

// so_far + grad for a 16-bit copy of a `wide` value: both terms in `wide` (the narrow one widened).
at::Tensor widened_sum(at::Tensor so_far, at::Tensor grad, at::ScalarType wide) {
  if (static_cast<size_t>(so_far.element_size()) < c10::elementSize(wide)) so_far = so_far.to(wide);
  if (grad.scalar_type() != so_far.scalar_type()) grad = grad.to(so_far.scalar_type());
  return so_far + grad;
}

}  // namespace

void accumulate_grad(TensorInfo& t, at::Tensor grad) {
  if (!t.requires_grad || !grad.defined()) return;
  if (!t.is_leaf) {
    // Taken first: memory made for the sum may not park what the sum reads.
    MemoryHooks& memory = t.owner->memory_hooks();
    at::Tensor so_far = memory.take_gradient(t);
    // A 16-bit copy of a wider value that several ops read (autocast's one copy of a weight, read
    // by each chunk of the output layer) sums their gradients in the source's type, as a single
    // product's accumulator would; its cast's backward hands the sum on as it is.
    // (Both terms are widened here, where a meta trace sees the copies: a sum of mixed types
    // would convert the narrow one inside ATen's kernel, in a buffer no trace holds.)
    const ComputePath* producer = t.producer.get();
    if (!so_far.defined()) {
      t.grad = std::move(grad);
    } else if (producer != nullptr && producer->op->traits().converts_type) {
      t.grad = widened_sum(std::move(so_far), std::move(grad), producer->inputs[0]->dtype);
    } else {
      t.grad = so_far + grad;
    }
    memory.gradient_pending(t);
    return;
  }
  if (t.grad_to.defined()) {
    // A weight's 16-bit copy: its readers' gradients are summed here, as the cast copy's were
    // (both terms in the weight's type once there are two), and the sum goes to the weight when
    // the copy's last reader has run (flush_copy_gradient): the same additions in the same order.
    t.grad = t.grad.defined() ? widened_sum(std::move(t.grad), std::move(grad), t.grad_to.scalar_type()) : std::move(grad);
    return;
  }
  add_to_weight(t.value, *t.owner, std::move(grad));
}

void add_to_weight(const at::Tensor& weight, Interpreter& owner, at::Tensor grad) {
  // A leaf's gradient lives in its at::Tensor's .grad(), where torch::optim reads it. As
  // libtorch's AccumulateGrad does, steal the tensor when nobody else holds it (it may be shared,
  // e.g. add's backward hands one tensor to both inputs), and add in place afterwards. A 16-bit
  // gradient of an fp32 weight converts inside the copy or the add: one pass, no cast kernel.
  at::Tensor& acc = const_cast<at::Tensor&>(weight).mutable_grad();
  const GradientSlots* buffer = owner.gradient_buffer();
  if (!acc.defined() && buffer != nullptr) {
    at::Tensor slot = buffer->slot(weight);
    if (slot.defined()) {
      acc = slot.copy_(grad);
      return;
    }
  }
  if (!acc.defined()) {
    if (grad.scalar_type() != weight.scalar_type()) {
      acc = grad.to(weight.scalar_type());
      return;
    }
    const bool sole_owner = grad.use_count() == 1 && grad.storage().use_count() == 1;
    acc = sole_owner ? std::move(grad) : grad.clone();
  } else {
    add_widened(acc, grad);
  }
}

void flush_copy_gradient(TensorInfo& copy) {
  if (!copy.grad.defined()) return;
  at::Tensor sum = std::move(copy.grad);
  copy.grad = at::Tensor();
  add_to_weight(copy.grad_to, *copy.owner, std::move(sum));
}

Tape::SavedWeights Tape::saved_weights() const {
  SavedWeights out;
  for (const TapeEntry& e : entries_) {
    for (const Tensor& saved : e.saved_inputs) {
      if (!saved.defined()) continue;
      // A view of a weight (a transpose kept for backward) reads the weight's storage.
      const TensorInfo& root = saved.info()->base != nullptr ? *saved.info()->base : *saved.info();
      if (root.is_weight) {
        out.as_is.push_back(root.value);
        continue;
      }
      const ComputePath* producer = root.producer.get();
      if (producer == nullptr || !producer->op->traits().converts_type || producer->inputs.empty()) continue;
      if (producer->inputs[0]->is_weight) out.casts.push_back(producer->inputs[0]->value);
    }
  }
  return out;
}

void Tape::record(const std::shared_ptr<ComputePath>& path, const std::vector<Tensor>& outputs, int block) {
  const OpTraits& traits = path->op->traits();
  TapeEntry entry;
  entry.path = path;
  entry.block = block;
  entry.saved_inputs.resize(path->inputs.size());
  for (size_t i = 0; i < path->inputs.size(); ++i) {
    if (traits.saves_inputs & (1u << i)) entry.saved_inputs[i] = Tensor(path->inputs[i]);
  }
  entry.saved_outputs.resize(outputs.size());
  for (size_t j = 0; j < outputs.size(); ++j) {
    if (traits.saves_outputs & (1u << j)) entry.saved_outputs[j] = outputs[j];
  }
  entries_.push_back(std::move(entry));
}

void Tape::backward(Interpreter& interp, const std::vector<Tensor>& roots,
                    const std::vector<at::Tensor>& grads, BackwardPart part) {
  TORCH_CHECK(roots.size() == grads.size(), "backward: ", roots.size(), " roots but ",
              grads.size(), " gradients");
  TORCH_CHECK(part != BackwardPart::kWeights || roots.empty(), "backward: the weights' part takes no roots");
  for (size_t i = 0; i < roots.size(); ++i) {
    TORCH_CHECK(roots[i].requires_grad(),
                "backward: root ", i, " does not require grad (no parameter reaches it)");
    TORCH_CHECK(grads[i].sizes() == roots[i].sizes(), "backward: gradient ", i, " has shape ",
                grads[i].sizes(), " but its root has ", roots[i].sizes());
    accumulate_grad(*roots[i].info(), grads[i]);
  }
  // Tape order is execution order, so its reverse is a valid order for reverse mode. Each
  // entry is released as soon as it has run: its saved values go with it.
  GradientListener* listener = part == BackwardPart::kInputs ? nullptr : interp.gradient_listener();
  // Per leaf value (one parameter may be several leaf records: one per use), the entries left
  // that take it as input.
  std::unordered_map<const c10::TensorImpl*, int64_t> pending;
  if (listener != nullptr) pending = pending_leaves(*listener);
  // Per weight's 16-bit copy (a leaf record of this backward's forward), the entries left that
  // read it: after the last, the sum of its gradients goes to the weight.
  std::unordered_map<TensorInfo*, int64_t> copies;
  if (interp.reads_weight_copies()) {
    for (const TapeEntry& e : entries_)
      for (const std::shared_ptr<TensorInfo>& input : e.path->inputs)
        if (input->grad_to.defined() && input->requires_grad) ++copies[input.get()];
  }
  std::vector<TapeEntry> owing;  // kInputs: entries whose weights' part is still to run
  const int lookahead = interp.memory_hooks().prefetch_lookahead();
  auto ahead = entries_.rbegin();  // host swap: the next entry whose saved values to prefetch
  ParameterSource* parameters = interp.parameter_source();
  if (parameters != nullptr && part == BackwardPart::kAll) {
    const SavedWeights saved = saved_weights();
    parameters->backward_will_read(saved.as_is);
    parameters->backward_will_read_casts_of(saved.casts);
  }
  int block = -1;  // the block whose entries run (sharded parameters gather ahead of the next)
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
    if (lookahead > 0) prefetch_saved(interp, it, ahead, lookahead);
    if (parameters != nullptr && it->block >= 0 && it->block != block) {
      block = it->block;
      parameters->backward_enters(block);
    }
    if (run_entry(interp, *it, part)) {
      owing.push_back(std::move(*it));
      continue;
    }
    for (const std::shared_ptr<TensorInfo>& input : it->path->inputs) {
      if (!input->is_leaf || !input->requires_grad) continue;
      if (input->grad_to.defined() && --copies[input.get()] == 0) flush_copy_gradient(*input);
      if (listener == nullptr) continue;
      const at::Tensor& weight = gradient_target(*input);
      auto left = pending.find(weight.unsafeGetTensorImpl());
      if (left != pending.end() && --left->second == 0) listener->gradient_ready(weight);
    }
    *it = TapeEntry{};
  }
  entries_.assign(std::make_move_iterator(owing.rbegin()), std::make_move_iterator(owing.rend()));
}

void Tape::prefetch_saved(Interpreter& interp, std::vector<TapeEntry>::reverse_iterator now,
                          std::vector<TapeEntry>::reverse_iterator& ahead, int lookahead) {
  if (ahead < now) ahead = now;
  for (; ahead != entries_.rend() && ahead - now < lookahead; ++ahead) {
    for (auto* saved : {&ahead->saved_inputs, &ahead->saved_outputs}) {
      for (const Tensor& s : *saved) {
        if (!s.defined()) continue;
        TensorInfo* root = s.info()->is_view() ? s.info()->base : s.info();
        if (!interp.memory_hooks().prefetch(*root)) return;  // no room now: the same entry next time
      }
    }
  }
}

std::unordered_map<const c10::TensorImpl*, int64_t> Tape::pending_leaves(GradientListener& listener) const {
  std::unordered_map<const c10::TensorImpl*, int64_t> pending;
  for (const TapeEntry& entry : entries_)
    for (const std::shared_ptr<TensorInfo>& input : entry.path->inputs)
      if (input->is_leaf && input->requires_grad) ++pending[gradient_target(*input).unsafeGetTensorImpl()];
  std::vector<const c10::TensorImpl*> leaves;
  leaves.reserve(pending.size());
  for (const auto& [impl, count] : pending) leaves.push_back(impl);
  listener.backward_begins(leaves);
  return pending;
}

bool Tape::run_entry(Interpreter& interp, TapeEntry& entry, BackwardPart part) {
  ComputePath& path = *entry.path;
  std::vector<at::Tensor> grad_outputs(path.outputs.size());
  bool any_grad = false;
  if (part == BackwardPart::kWeights) {
    grad_outputs = std::move(entry.deferred_grads);
    entry.deferred_grads.clear();
    for (const at::Tensor& g : grad_outputs) any_grad = any_grad || g.defined();
  } else {
    for (size_t j = 0; j < path.outputs.size(); ++j) {
      TensorInfo* out = path.outputs[j];
      if (out != nullptr && out->has_gradient()) {
        grad_outputs[j] = interp.memory_hooks().take_gradient(*out);
        any_grad = true;
      }
    }
  }
  if (!any_grad) return false;  // not on a path to the loss
  // Which inputs get a gradient in this part.
  std::vector<bool> needs_input_grad(path.inputs.size());
  bool any_input = false, owes_weights = false;
  for (size_t i = 0; i < path.inputs.size(); ++i) {
    const TensorInfo& in = *path.inputs[i];
    const bool weight = in.is_leaf && in.is_weight;
    needs_input_grad[i] = in.requires_grad && (part == BackwardPart::kAll || (part == BackwardPart::kWeights) == weight);
    any_input = any_input || needs_input_grad[i];
    owes_weights = owes_weights || (part == BackwardPart::kInputs && in.requires_grad && weight);
  }
  if (owes_weights) entry.deferred_grads = grad_outputs;  // shares the tensors: no copy
  if (!any_input) return owes_weights;
  if (interp.memory_hooks().watches_backward_stages()) {  // only static plans look at stages
    std::vector<const TensorInfo*> saved;
    for (auto* list : {&entry.saved_inputs, &entry.saved_outputs})
      for (const Tensor& s : *list)
        if (s.defined()) saved.push_back(s.info());
    interp.memory_hooks().backward_stage_begins(path, saved);
  }

  std::vector<TensorInfo*> input_infos(path.inputs.size());
  for (size_t i = 0; i < path.inputs.size(); ++i) input_infos[i] = path.inputs[i].get();

  // Saved values: pin all, then make each resident (regenerating it if it was dropped).
  auto pin_all = [&](int delta) {
    for (auto* saved : {&entry.saved_inputs, &entry.saved_outputs})
      for (Tensor& s : *saved)
        if (s.defined()) s.info()->pin_count += delta;
  };
  pin_all(+1);
  // Weights read from here to the kernel's end stay gathered (sharded parameters).
  std::optional<ParameterReads> reads(std::in_place, interp.parameter_source());
  auto values_of = [&](std::vector<Tensor>& saved) {
    std::vector<at::Tensor> values(saved.size());
    for (size_t k = 0; k < saved.size(); ++k)
      if (saved[k].defined()) values[k] = interp.materialize(*saved[k].info());
    return values;
  };
  std::vector<at::Tensor> inputs = values_of(entry.saved_inputs);
  std::vector<at::Tensor> outputs = values_of(entry.saved_outputs);
  // A backward kernel is one tick of the interpreter's clock, as a forward one is: what it reads
  // is accessed then.
  const uint64_t now = interp.tick();
  for (auto* saved : {&entry.saved_inputs, &entry.saved_outputs})
    for (Tensor& s : *saved)
      if (s.defined()) s.info()->last_access = now;
  interp.memory_hooks().before_backward(path);

  std::vector<at::Tensor> grads;
  {
    at::AutoGradMode no_autograd(false);
    // metrics.time_by_op alone times backward kernels: an untimed step reads no clock here.
    OpTimeLog* log = interp.op_time_log();
    std::optional<KernelTimer> timer;
    if (log != nullptr) {
      at::Device device(at::kCPU);  // where the kernel runs: where its gradients are
      for (const at::Tensor& g : grad_outputs) {
        if (g.defined()) device = g.device();
      }
      timer.emplace(device);
    }
    grads = run_with_room(interp.memory_hooks(), [&] {
      if (timer) timer->start();  // a rerun after making room times itself alone
      auto g = path.op->backward(BackwardArgs{inputs, outputs, grad_outputs, input_infos, needs_input_grad});
      if (timer) timer->stop();
      return g;
    });
    if (timer) log->add(path.op->traits().name, OpTimeLog::Pass::kBackward, *timer);
  }
  interp.memory_hooks().after_backward(path);
  // The kernel is done with what it read: let go of it before the gradients are added up (a
  // sum allocates; an evicted saved value or an output gradient held here would free nothing).
  inputs.clear();
  outputs.clear();
  grad_outputs.clear();
  reads.reset();
  pin_all(-1);
  interp.memory_hooks().backward_stage_ends(path);
  TORCH_INTERNAL_ASSERT(grads.size() == path.inputs.size(), path.op->traits().name,
                        ": backward returned ", grads.size(), " gradients for ",
                        path.inputs.size(), " inputs");
  for (size_t i = 0; i < grads.size(); ++i) {
    if (needs_input_grad[i] && grads[i].defined())
      accumulate_grad(*path.inputs[i], std::move(grads[i]));
  }
  return owes_weights;
}

}  // namespace ht

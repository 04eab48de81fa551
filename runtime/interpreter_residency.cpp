// Interpreter: residency of tensor data. Rules (docs/engine.md):
//  - a record holds data while anyone will read it (handles, pins) or a resident view shares it;
//  - a view shares its root's storage: the root is kept while any view is resident, and evicting
//    a root evicts its views; a dropped view is regenerated from its base by its view op;
//  - leaves and outputs of non-recomputable ops (and of collectives while they are kept,
//    set_keep_collectives) keep their data while their record lives;
//  - a dropped tensor with a copy in host memory (host swap) comes back by the copy.
#include "runtime/interpreter.h"

#include <algorithm>

namespace ht {

void Interpreter::link_alias(TensorInfo& out, const ComputePath& path, const at::Tensor& value,
                             size_t output_index) {
  auto root_of = [](TensorInfo* t) { return t->is_view() ? t->base : t; };
  TensorInfo* root = nullptr;
  for (const auto& in : path.inputs) {
    if (value.is_alias_of(in->value)) {
      root = root_of(in.get());
      break;
    }
  }
  for (size_t k = 0; root == nullptr && k < output_index; ++k) {
    TensorInfo* earlier = path.outputs[k];
    if (earlier != nullptr && value.is_alias_of(earlier->value)) root = root_of(earlier);
  }
  if (root != nullptr) {
    out.base = root;
    root->views.push_back(&out);
    out.nbytes = 0;
  } else {
    out.nbytes = value.has_storage() ? static_cast<int64_t>(value.storage().nbytes()) : 0;
  }
}

void Interpreter::attach(TensorInfo& t, at::Tensor value) {
  TORCH_INTERNAL_ASSERT(!t.resident(), "attach: already resident");
  t.value = std::move(value);
  t.residency = Residency::kResident;
  t.last_access = tick_;  // made by the kernel that ran at this tick
  if (t.base != nullptr) {
    TORCH_INTERNAL_ASSERT(t.base->resident(), "attach: a view became resident without its root");
    ++t.base->resident_views;
  }
  if (!t.is_leaf) memory_->on_resident(t);
}

void Interpreter::drop(TensorInfo& t) {
  TORCH_INTERNAL_ASSERT(t.resident() && !t.is_leaf && t.pin_count == 0, "drop: not droppable");
  t.value.reset();
  t.residency = Residency::kEvicted;
  memory_->on_dropped(t);
  if (t.base != nullptr) {
    --t.base->resident_views;
    release_if_unused(*t.base);
  }
}

void Interpreter::release_if_unused(TensorInfo& t) {
  if (t.is_leaf || !t.resident() || t.handle_refs > 0 || t.pin_count > 0 || t.resident_views > 0)
    return;
  if (!t.producer || !recomputes(*t.producer)) return;
  drop(t);
  // Nobody will read it: its copy in host memory goes too, unless a view of it lives on (saved
  // for backward, dropped with it): the view comes back through this copy. Llama's attention
  // saves transposes of rope's outputs; discarding their copies here made every block run its
  // QKV product again three times in backward (72 regenerations a step, 35 ms on Llama-6L). The
  // copy goes when the record does (MemoryManager::on_destroyed).
  if (t.views.empty()) memory_->release_host_copy(t);
}

void Interpreter::on_handle_released(TensorInfo& t) {
  TORCH_INTERNAL_ASSERT(t.handle_refs > 0, "handle released twice");
  --t.handle_refs;
  release_if_unused(t);
}

void Interpreter::on_record_destroyed(TensorInfo& t) {
  --live_records_;
  TORCH_INTERNAL_ASSERT(t.views.empty(), "a root record died before its views");
  if (t.base != nullptr) {
    auto& views = t.base->views;
    views.erase(std::find(views.begin(), views.end(), &t));
    if (t.resident()) {
      --t.base->resident_views;
      release_if_unused(*t.base);
    }
  }
  if (t.producer) t.producer->outputs[t.output_index] = nullptr;
  if (!t.is_leaf) memory_->on_destroyed(t);
}

void Interpreter::evict(TensorInfo& t) {
  TORCH_CHECK(t.evictable(), "evict: tensor ", t.id, " is not evictable");
  // Views first: a root's storage is only freed once no view holds it.
  const std::vector<TensorInfo*> views = t.views;
  for (TensorInfo* v : views) {
    if (v->resident()) drop(*v);
  }
  if (t.resident()) drop(t);  // dropping the last view may already have released it
}

void Interpreter::read_weight(const TensorInfo& t) {
  // A view of a weight (a transpose kept for backward) reads the weight's storage too.
  const TensorInfo& root = t.base != nullptr ? *t.base : t;
  if (root.is_weight && parameter_source_ != nullptr) parameter_source_->before_read(root.value, *memory_, tick_);
}

const at::Tensor& Interpreter::materialize(TensorInfo& target) {
  if (target.resident()) {
    if (parameter_source_ != nullptr) {
      ++target.pin_count;  // making room for a gathered weight must not drop what is returned
      read_weight(target);
      --target.pin_count;
    }
    target.last_access = tick_;
    return target.value;
  }
  // Explicit work stack (MegEngine's design): a frame is expanded once (its producer's inputs
  // pinned and the missing ones pushed), then run when all inputs are resident. A pin means
  // "a pending frame will read this": it keeps regenerated inputs alive exactly as long as needed.
  struct Frame {
    TensorInfo* t;
    bool expanded;
  };
  std::vector<Frame> stack{{&target, false}};
  ++target.pin_count;
  while (!stack.empty()) {
    TensorInfo* t = stack.back().t;
    ComputePath* path = t->producer.get();
    if (!stack.back().expanded) {
      if (t->resident()) {  // regenerated meanwhile, as another output of an op call
        stack.pop_back();
        continue;
      }
      if (memory_->comes_back_by_copy(*t)) {  // host swap: a copy back, never a recomputation
        attach(*t, memory_->swap_in(*t));
        stack.pop_back();
        continue;
      }
      TORCH_CHECK(path != nullptr && recomputes(*path), "cannot regenerate tensor ",
                  t->id, ": ", path ? "its producer op is not recomputable" : "it is a leaf");
      stack.back().expanded = true;
      for (auto& in : path->inputs) ++in->pin_count;
      for (auto& in : path->inputs) {
        if (!in->resident()) stack.push_back({in.get(), false});
      }
      continue;
    }
    if (!t->resident()) {
      std::vector<at::Tensor> outs = run_kernel(*path, /*recompute=*/true);
      for (size_t j = 0; j < outs.size(); ++j) {
        TensorInfo* out = path->outputs[j];
        if (out == nullptr || out->resident()) continue;
        if (out->handle_refs > 0 || out->pin_count > 0) {
          attach(*out, std::move(outs[j]));
          ++out->recompute_count;
        }
      }
    }
    stack.pop_back();
    for (auto& in : path->inputs) {
      --in->pin_count;
      release_if_unused(*in);
    }
  }
  --target.pin_count;
  target.last_access = tick_;
  return target.value;
}

}  // namespace ht

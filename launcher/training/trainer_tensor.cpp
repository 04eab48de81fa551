// Trainer: what tensor parallelism adds to a step and a checkpoint. Each rank of a group holds its
// parts of the split parameters (models/decoder_split.h) and the whole of the replicated ones,
// whose gradients are equal on every rank of the group: the step's norm counts the parts of every
// rank and one copy of the rest; a checkpoint is written from, and read into, the whole tensors
// (the one model-wide layout), gathered for the moment it takes.
#include "launcher/training/trainer.h"

#include "alloc/cpu_device_allocator.h"
#include "models/decoder.h"
#include "models/decoder_split.h"

#include <cmath>
#include <set>

namespace ht {

StepAcrossStages Trainer::tensor_step_hooks() {
  StepAcrossStages hooks;
  hooks.gradient_norm = [this] {
    const std::vector<bool> split = model_->split_parameters();
    const std::vector<at::Tensor> all = model_->parameters();
    std::set<const void*> own;  // what this rank trains: a stage's own, never a tied weight's copy
    for (const at::Tensor& p : pipeline_ ? pipeline_->parameters() : params_) {
      if (!pipeline_ || !pipeline_->holds_tied_copy(p)) own.insert(p.unsafeGetTensorImpl());
    }
    double squares = 0;
    for (size_t i = 0; i < all.size(); ++i) {
      const at::Tensor& p = all[i];
      if (!p.grad().defined() || own.count(p.unsafeGetTensorImpl()) == 0) continue;
      if (!split[i] && tensor_->rank() != 0) continue;  // replicated: counted on the group's first rank
      squares += p.grad().to(at::kDouble).square().sum().item<double>();
    }
    at::Tensor total = at::full({1}, squares, at::kDouble);
    tensor_->communicator().allreduce_sum(total, "the gradient norm");
    if (pipeline_) pipeline_->group().allreduce_sum(total, "the gradient norm");
    return std::sqrt(total.item<double>());
  };
  hooks.all_finite = [this](bool finite) {
    at::Tensor not_finite = at::full({1}, finite ? 0.0 : 1.0, at::kDouble);  // ranks that saw inf or NaN
    tensor_->communicator().allreduce_sum(not_finite, "the finite check");
    const bool group_finite = not_finite.item<double>() == 0.0;
    return pipeline_ ? pipeline_->all_stages(group_finite) : group_finite;
  };
  return hooks;
}

void Trainer::with_whole_tensors(const std::function<void()>& fn) {
  const auto* decoder = dynamic_cast<const Decoder*>(model_.get());
  TORCH_INTERNAL_ASSERT(decoder != nullptr && tensor_, "with_whole_tensors: a decoder split across a group");
  const DecoderOptions& options = decoder->options();
  const int t = tensor_->size();
  at::NoGradGuard no_grad;
  // Every rank's part of `part` (same shape on each), whole.
  auto gathered = [&](const std::string& name, const at::Tensor& part) {
    HostAllocationScope host;  // the whole lives on the host for the moment it is needed
    const at::Tensor dense = part.contiguous();
    at::Tensor buffer = at::empty({t * dense.numel()}, dense.options());
    tensor_->all_gather(dense.view(-1), buffer, "a checkpoint's whole tensors");
    std::vector<at::Tensor> parts;
    for (int r = 0; r < t; ++r) parts.push_back(buffer.narrow(0, r * dense.numel(), dense.numel()).view(dense.sizes()));
    return whole_of(options, name, parts);
  };
  struct Held {
    at::Tensor param;
    ParameterSplit split;
    bool has_state = false;
  };
  std::vector<Held> held;
  for (const auto& item : model_->named_parameters()) {
    const ParameterSplit split = decoder_parameter_split(options, item.key());
    if (!split.split()) continue;
    at::Tensor param = item.value();
    std::vector<at::Tensor> state = optimizer_state(*optimizer_, param);
    for (size_t k = 0; k < state.size(); ++k) {
      if (state[k].dim() > 0) state[k] = gathered(item.key(), state[k]);
    }
    param.set_data(gathered(item.key(), param));
    if (!state.empty()) set_optimizer_state(*optimizer_, param, state);
    held.push_back({param, split, !state.empty()});
  }
  struct Parts {  // this rank's parts again, also when fn throws
    std::vector<Held>& held;
    torch::optim::Optimizer& optimizer;
    ~Parts() {
      for (Held& h : held) {
        std::vector<at::Tensor> state = optimizer_state(optimizer, h.param);
        for (at::Tensor& s : state)
          if (s.dim() > 0) s = part_of(s, h.split);
        h.param.set_data(part_of(h.param, h.split));
        if (!state.empty()) set_optimizer_state(optimizer, h.param, state);
      }
    }
  } parts{held, *optimizer_};
  fn();
}

}  // namespace ht

// Trainer: what tensor parallelism adds to a step and a checkpoint. Each rank of a group holds its
// parts of the split parameters (models/decoder_split.h) and the whole of the replicated ones,
// whose gradients are equal on every rank of the group: the step's norm counts the parts of every
// rank and one copy of the rest (with sharded gradients, every replica's pieces of them). A
// checkpoint is each rank's slices of its parts (trainer_slices.cpp); a whole one (model.pt) is
// read into the whole tensors, gathered for the moment it takes.
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
    std::set<const void*> split;
    {
      const std::vector<bool> flags = model_->split_parameters();
      const std::vector<at::Tensor> all = model_->parameters();
      for (size_t i = 0; i < all.size(); ++i)
        if (flags[i]) split.insert(all[i].unsafeGetTensorImpl());
    }
    // Replicated weights' gradients are equal on every rank of the group: counted on its first.
    auto counted = [&](const at::Tensor& param) {
      return tensor_->rank() == 0 || split.count(param.unsafeGetTensorImpl()) > 0;
    };
    double squares = 0;
    if (grad_shards_) {
      // Sharded gradients: each replica holds its pieces' (parallel.shard = "gradients", "parameters").
      const std::vector<at::Tensor>& pieces = shard_->pieces();
      for (size_t i = 0; i < pieces.size(); ++i) {
        if (!pieces[i].grad().defined() || !counted(*shard_->piece_of(i).param)) continue;
        squares += pieces[i].grad().to(at::kDouble).square().sum().item<double>();
      }
    } else {
      for (const at::Tensor& p : pipeline_ ? pipeline_->parameters() : params_) {
        // A stage's own, never a tied weight's copy.
        if (!p.grad().defined() || (pipeline_ && pipeline_->holds_tied_copy(p)) || !counted(p)) continue;
        squares += p.grad().to(at::kDouble).square().sum().item<double>();
      }
    }
    at::Tensor total = at::full({1}, squares, at::kDouble);
    if (grad_shards_) replicas_.group().allreduce_sum(total, "the gradient norm");
    tensor_->communicator().allreduce_sum(total, "the gradient norm");
    if (pipeline_) pipeline_->group().allreduce_sum(total, "the gradient norm");
    return std::sqrt(total.item<double>());
  };
  hooks.all_finite = [this](bool finite) {
    at::Tensor not_finite = at::full({1}, finite ? 0.0 : 1.0, at::kDouble);  // ranks that saw inf or NaN
    if (grad_shards_) replicas_.group().allreduce_sum(not_finite, "the finite check");
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
  // The parts' own tensors are kept and written back into: under a budget they lie in the
  // arena's blocks (compact_parameters, compact_optimizer_state), which must stay as they are.
  struct Held {
    at::Tensor param;
    ParameterSplit split;
    at::Tensor part;                // the parameter's part, its storage
    std::vector<at::Tensor> state;  // the optimizer state's parts (empty: none yet)
  };
  std::vector<Held> held;
  for (const auto& item : model_->named_parameters()) {
    const ParameterSplit split = decoder_parameter_split(options, item.key());
    if (!split.split()) continue;
    at::Tensor param = item.value();
    Held h{param, split, param.detach(), optimizer_state(*optimizer_, param)};
    std::vector<at::Tensor> whole = h.state;
    for (at::Tensor& s : whole)
      if (s.dim() > 0) s = gathered(item.key(), s);
    param.set_data(gathered(item.key(), param));
    if (!whole.empty()) set_optimizer_state(*optimizer_, param, whole);
    held.push_back(std::move(h));
  }
  struct Parts {  // this rank's parts again, also when fn throws
    std::vector<Held>& held;
    torch::optim::Optimizer& optimizer;
    ~Parts() {
      for (Held& h : held) {
        auto part_on_host = [&](const at::Tensor& whole) {  // a temporary, outside the budget
          HostAllocationScope host;
          return part_of(whole, h.split);
        };
        std::vector<at::Tensor> whole = optimizer_state(optimizer, h.param);  // read back, or kept
        std::vector<at::Tensor> parts = h.state;
        if (parts.size() != whole.size()) parts.assign(whole.size(), at::Tensor());  // none before: new tensors
        for (size_t k = 0; k < whole.size(); ++k) {
          if (whole[k].dim() == 0) {
            parts[k] = whole[k];  // AdamW's step
          } else if (parts[k].defined()) {
            parts[k].copy_(part_on_host(whole[k]));
          } else {
            parts[k] = part_on_host(whole[k]).clone();  // device memory
          }
        }
        h.part.copy_(part_on_host(h.param));
        h.param.set_data(h.part);
        if (!whole.empty()) set_optimizer_state(optimizer, h.param, parts);
      }
    }
  } parts{held, *optimizer_};
  fn();
}

}  // namespace ht

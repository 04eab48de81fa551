// ExecutionMode::kAutograd: the oracle and the benchmark baseline. The same op forwards run on
// tensors that libtorch's autograd records; gradients come from torch::autograd::backward.
// Nothing is taped, dropped or regenerated in this mode.
#include "runtime/interpreter.h"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>

namespace ht {

std::vector<Tensor> Interpreter::apply_autograd(std::shared_ptr<const Op> op,
                                                const std::vector<Tensor>& inputs) {
  std::vector<at::Tensor> in_values;
  in_values.reserve(inputs.size());
  for (const Tensor& in : inputs) in_values.push_back(in.info()->value);
  std::vector<at::Tensor> outs;
  {
    at::AutoGradMode autograd(grad_enabled_);
    outs = op->forward(in_values, ForwardContext{false});
  }
  std::vector<Tensor> handles;
  handles.reserve(outs.size());
  for (at::Tensor& out : outs) {
    auto info = new_record(out);
    info->is_leaf = true;  // no lineage in this mode: autograd owns the graph
    info->requires_grad = out.requires_grad();
    info->value = std::move(out);
    info->residency = Residency::kResident;
    handles.emplace_back(std::move(info));
  }
  return handles;
}

void Interpreter::backward(const std::vector<Tensor>& roots, const std::vector<at::Tensor>& grads) {
  clear_cast_cache();  // the forward is over; the next one casts the updated weights afresh
  if (options_.mode == ExecutionMode::kInterpreted) {
    tape_.backward(*this, roots, grads);
    return;
  }
  std::vector<at::Tensor> values;
  values.reserve(roots.size());
  for (const Tensor& r : roots) values.push_back(r.info()->value);
  torch::autograd::backward(values, grads);
}

}  // namespace ht

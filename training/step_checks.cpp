#include "training/step_checks.h"

#include "alloc/cpu_device_allocator.h"

#include <set>

namespace ht {
namespace {

// A {1} double 0 where the gradients are (a CPU rank's outside its arena: it lives through the
// norm's collectives, where the host number it replaced took no block): the sum of squares the
// collectives add to, never read by the host.
at::Tensor device_zero(at::Device device) {
  const HostAllocationScope host(device.is_cpu());
  return at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(device));
}

}  // namespace

StepAcrossStages pipeline_checks(PipelineStage& stage) {
  StepAcrossStages hooks;
  hooks.gradient_norm = [&stage] { return combine_norms(stage.gradient_norms()); };
  hooks.all_finite = [&stage](bool finite) { return stage.all_stages(finite); };
  return hooks;
}

StepAcrossStages shard_checks(const OptimizerShard& shard, Communicator& replicas, at::Device device) {
  StepAcrossStages hooks;
  hooks.gradient_norm = [&shard, &replicas, device] {
    const at::Tensor norms = gradient_norms(shard.pieces());
    at::Tensor squares = norms.numel() > 0 ? norms.square().sum().reshape({1}) : device_zero(device);
    replicas.allreduce_sum(squares, "the gradient norm");
    return squares.sqrt().reshape({});
  };
  hooks.all_finite = [&replicas](bool finite) {
    at::Tensor not_finite = at::full({1}, finite ? 0.0 : 1.0, at::kDouble);  // ranks that saw inf or NaN
    replicas.allreduce_sum(not_finite, "the finite check");
    return not_finite.item<double>() == 0.0;
  };
  return hooks;
}

StepAcrossStages tensor_checks(Communicator& group, const std::vector<at::Tensor>& model_params,
                               const std::vector<bool>& split, const std::vector<at::Tensor>& params,
                               const OptimizerShard* shard, Communicator* replicas, PipelineStage* stage,
                               at::Device device) {
  std::set<const void*> parts;
  for (size_t i = 0; i < model_params.size(); ++i)
    if (split[i]) parts.insert(model_params[i].unsafeGetTensorImpl());
  StepAcrossStages hooks;
  hooks.gradient_norm = [&group, parts, params, shard, replicas, stage, device] {
    // Replicated weights' gradients are equal on every rank of the group: counted on its first.
    auto counted = [&](const at::Tensor& param) {
      return group.rank() == 0 || parts.count(param.unsafeGetTensorImpl()) > 0;
    };
    // Summed in double on the device, in model order: the host's sum, bit for bit, unread.
    at::Tensor squares = device_zero(device);
    if (shard != nullptr) {
      // Sharded gradients: each replica holds its pieces' (parallel.shard = "gradients", "parameters").
      const std::vector<at::Tensor>& pieces = shard->pieces();
      for (size_t i = 0; i < pieces.size(); ++i) {
        if (!pieces[i].grad().defined() || !counted(*shard->piece_of(i).param)) continue;
        squares.add_(pieces[i].grad().to(at::kDouble).square().sum());
      }
    } else {
      for (const at::Tensor& p : params) {
        // A stage's own, never a tied weight's copy.
        if (!p.grad().defined() || (stage != nullptr && stage->holds_tied_copy(p)) || !counted(p)) continue;
        squares.add_(p.grad().to(at::kDouble).square().sum());
      }
    }
    if (replicas != nullptr) replicas->allreduce_sum(squares, "the gradient norm");
    group.allreduce_sum(squares, "the gradient norm");
    if (stage != nullptr) stage->group().allreduce_sum(squares, "the gradient norm");
    return squares.sqrt().reshape({});
  };
  hooks.all_finite = [&group, replicas, stage](bool finite) {
    at::Tensor not_finite = at::full({1}, finite ? 0.0 : 1.0, at::kDouble);  // ranks that saw inf or NaN
    if (replicas != nullptr) replicas->allreduce_sum(not_finite, "the finite check");
    group.allreduce_sum(not_finite, "the finite check");
    const bool group_finite = not_finite.item<double>() == 0.0;
    return stage != nullptr ? stage->all_stages(group_finite) : group_finite;
  };
  return hooks;
}

}  // namespace ht

// Automatic mixed precision: the cast each op's declared Precision asks for, applied by the
// interpreter before the op runs (PyTorch's autocast lists, as data on the ops).
#include "runtime/interpreter.h"
#include "runtime/ops.h"

namespace ht {
namespace {

// fp32, bf16 and fp16 take part; doubles (and integers) are left alone.
bool castable(at::ScalarType t) { return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf; }

// The widest floating type among the inputs: fp32 if any is fp32, or if bf16 meets fp16.
std::optional<at::ScalarType> widest_type(const std::vector<Tensor>& inputs) {
  std::optional<at::ScalarType> widest;
  for (const Tensor& in : inputs) {
    if (!in.defined() || !castable(in.dtype())) continue;
    widest = (!widest || *widest == in.dtype()) ? in.dtype() : at::kFloat;
  }
  return widest;
}

}  // namespace

std::vector<Tensor> Interpreter::autocast_inputs(const Op& op, const std::vector<Tensor>& inputs) {
  const Precision precision = op.traits().precision;
  std::optional<at::ScalarType> target;  // for every input but input 0 of kFloat32Weights
  switch (precision) {
    case Precision::kAsIs:
    case Precision::kLowOutput: return {};
    case Precision::kLow: target = *autocast_; break;
    case Precision::kFloat32:
    case Precision::kFloat32Weights: target = at::kFloat; break;
    case Precision::kFollow: target = widest_type(inputs); break;
  }
  if (!target) return {};
  std::vector<Tensor> cast;
  bool changed = false;
  cast.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& in = inputs[i];
    const bool keeps_type = precision == Precision::kFloat32Weights && i == 0;
    if (!keeps_type && in.defined() && castable(in.dtype()) && in.dtype() != *target) {
      cast.push_back(cast_for_autocast(in, *target));
      changed = true;
    } else {
      cast.push_back(in);
    }
  }
  return changed ? cast : std::vector<Tensor>{};
}

Tensor Interpreter::cast_for_autocast(const Tensor& x, at::ScalarType dtype) {
  const TensorInfo& info = *x.info();
  // Weights (leaves whose at::Tensor is a trainable parameter, a leaf for libtorch too: in the
  // autograd reference mode activations are our leaves but not libtorch's) are cast once per
  // forward; activations each time they are used in another type.
  const at::Tensor& value = info.value;
  const bool weight = info.is_leaf && value.defined() && value.requires_grad() && value.is_leaf();
  if (!weight) return cast(x, dtype);
  const auto key = std::make_pair(static_cast<const void*>(value.unsafeGetTensorImpl()), dtype);
  auto it = cast_cache_.find(key);
  if (it != cast_cache_.end() && it->second.version == value._version()) return it->second.copy;
  Tensor copy = kept_copy(value, dtype);
  if (!copy.defined()) copy = cast(x, dtype);
  if (it == cast_cache_.end()) cast_order_.push_back(key);
  cast_cache_[key] = CachedCast{value, value._version(), copy};
  return copy;
}

Tensor Interpreter::kept_copy(const at::Tensor& weight, at::ScalarType dtype) {
  if (compute_weights_ == nullptr || options_.mode != ExecutionMode::kInterpreted) return {};
  at::Tensor copy = compute_weights_->copy_of(weight, dtype);
  if (!copy.defined()) return {};
  Tensor leaf = make_leaf(copy, weight.requires_grad());
  leaf.info()->is_weight = true;
  leaf.info()->grad_to = weight;
  return leaf;
}

std::vector<Tensor> Interpreter::autocast_outputs(std::vector<Tensor> outputs) {
  for (Tensor& out : outputs) {
    if (out.dtype() == at::kFloat) out = cast(out, *autocast_);
  }
  return outputs;
}

void Interpreter::clear_cast_cache() {
  for (const auto& key : cast_order_) cast_cache_.erase(key);
  cast_order_.clear();
  cast_cache_.clear();
}

}  // namespace ht

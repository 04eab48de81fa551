// Automatic mixed precision: the cast each op's declared Precision asks for, applied by the
// interpreter before the op runs (PyTorch's autocast lists, as data on the ops).
#include "runtime/interpreter.h"
#include "runtime/ops.h"

namespace ht {
namespace {

// fp32, bf16 and fp16 take part; doubles (and integers) are left alone.
bool castable(at::ScalarType t) { return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf; }

// The type input `index` is cast to, or nullopt: leave it as it is.
std::optional<at::ScalarType> target_type(Precision precision, at::ScalarType low, const std::vector<Tensor>& inputs,
                                          size_t index) {
  switch (precision) {
    case Precision::kAsIs: return std::nullopt;
    case Precision::kLow: return low;
    case Precision::kFloat32: return at::kFloat;
    case Precision::kFloat32Weights: return index == 0 ? std::nullopt : std::optional(at::kFloat);
    case Precision::kFollow: {
      // The widest: fp32 if any input is fp32, or if bf16 meets fp16.
      std::optional<at::ScalarType> widest;
      for (const Tensor& in : inputs) {
        if (!in.defined() || !castable(in.dtype())) continue;
        widest = (!widest || *widest == in.dtype()) ? in.dtype() : at::kFloat;
      }
      return widest;
    }
  }
  return std::nullopt;
}

}  // namespace

std::vector<Tensor> Interpreter::autocast_inputs(const Op& op, const std::vector<Tensor>& inputs) {
  const Precision precision = op.traits().precision;
  if (precision == Precision::kAsIs) return {};
  std::vector<Tensor> cast;
  bool changed = false;
  cast.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& in = inputs[i];
    const std::optional<at::ScalarType> target = target_type(precision, *autocast_, inputs, i);
    if (target && in.defined() && castable(in.dtype()) && in.dtype() != *target) {
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
  Tensor copy = cast(x, dtype);
  cast_cache_[key] = CachedCast{value, value._version(), copy};
  return copy;
}

}  // namespace ht

#pragma once
// One block of device memory for the gradients of a model's parameters, allocated once, before
// training (at the top of the arena, with the parameters). Backward copies each parameter's
// gradient into its slot instead of keeping the tensor its kernel allocated: under a budget,
// gradients allocated afresh every step land between the activations that backward is still
// regenerating, and cut the free memory into pieces no large activation fits in. (The same
// flat layout is what bucketed all-reduce wants: made in its reduction order, each bucket is one
// span of the block, reduced in place.)

#include <ATen/core/Tensor.h>

#include <optional>
#include <unordered_map>
#include <vector>

namespace ht {

// The type a gradient of `param` is kept in: `floating` for a floating parameter where given, else
// the parameter's own (GradientBuffer's slots, GradientShards' blocks).
inline at::ScalarType gradient_type_of(const at::Tensor& param, std::optional<at::ScalarType> floating) {
  return floating && at::isFloatingType(param.scalar_type()) ? *floating : param.scalar_type();
}

// Where backward puts a parameter's gradient: the tape asks for the slot of a parameter the first
// time a backward gives it a gradient (runtime/tape.cpp). An undefined slot: keep the tensor.
class GradientSlots {
 public:
  virtual ~GradientSlots() = default;
  virtual at::Tensor slot(const at::Tensor& param) const = 0;
};

// A gradient's 2-norm in its own type, or wider for a 16-bit gradient (ATen's norm of a bf16
// tensor is rounded to bf16's 8 bits): on the CPU a bf16 gradient's squares summed in double in
// one pass over its bits, elsewhere fp32. Every rank and stage takes a parameter's norm alike.
at::Tensor gradient_norm(const at::Tensor& grad);

class GradientBuffer final : public GradientSlots {
 public:
  // Slots for every parameter that requires a gradient, in the order given; one block per dtype
  // and device. With `floating`, a floating parameter's slot is of that type instead of its own
  // (training.gradient_dtype = "bf16": 16-bit gradients of fp32 weights).
  explicit GradientBuffer(const std::vector<at::Tensor>& params,
                          std::optional<at::ScalarType> floating = std::nullopt);
  // The slot of `param`'s gradient (a view of the block, its shape), or undefined.
  at::Tensor slot(const at::Tensor& param) const override;
  // The slots of `params`, one after another in one block, as one flat view; undefined when they
  // are not laid out so.
  at::Tensor span(const std::vector<at::Tensor>& params) const;

 private:
  struct Slot {
    at::Tensor view;
    size_t block = 0;
    int64_t offset = 0;  // elements into the block
  };
  std::vector<at::Tensor> blocks_;
  std::unordered_map<const void*, Slot> slots_;  // by TensorImpl
};

}  // namespace ht

#pragma once
// training.mixed_precision as an enum (base/choice.h), and the autocast type it sets on the
// interpreter (Interpreter::set_autocast): matmul, linear and conv in the low type.

#include "base/choice.h"

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>

namespace ht {

enum class MixedPrecision : uint8_t { kOff, kBf16, kFp16 };
template <>
struct ChoiceNames<MixedPrecision> {
  static constexpr std::pair<MixedPrecision, const char*> table[] = {
      {MixedPrecision::kOff, "off"}, {MixedPrecision::kBf16, "bf16"}, {MixedPrecision::kFp16, "fp16"}};
};

// training.compute_weights: where a 16-bit op reads a weight, it reads a copy made once per
// optimizer step and kept (Megatron's bf16 parameters), or a cast made at the read (autocast's,
// which a memory budget may drop and make again); auto: keeps_weight_copies below.
enum class ComputeWeightsMode : uint8_t { kAuto, kKept, kCast };
template <>
struct ChoiceNames<ComputeWeightsMode> {
  static constexpr std::pair<ComputeWeightsMode, const char*> table[] = {
      {ComputeWeightsMode::kAuto, "auto"}, {ComputeWeightsMode::kKept, "kept"}, {ComputeWeightsMode::kCast, "cast"}};
};

// Whether a run keeps 16-bit weight copies: asked for, or auto without a memory budget that
// evicts (under ZeRO-3 the copies are the shards', gathered in 16 bits: parallel/parameter_shards.h).
// Under a budget that evicts the copies are left to the memory manager as the casts' activations
// (any policy may drop one and cast again; kept copies under "full" at the bit matrix's tightest
// budget cut the arena into pieces an evaluation's tensor did not fit). Under a budget that never evicts (memory.policy = "none",
// which every plan for a device's memory carries) they are kept: the planner walks such a step
// without the casts, the copies resident (planner/weight_copy_terms.h, walks_without_casts), to
// within 0.05% of the runs measured (a ZeRO-2 MLP on 3 ranks it once priced 9% over; ZeRO-3's
// 16-bit gathers with prefetch 6% over until backward's regathers followed the casts backward
// reads). The trainer's parts and the planner decide alike.
inline bool keeps_weight_copies(ComputeWeightsMode mode, MixedPrecision precision, bool evicting_budget) {
  if (precision == MixedPrecision::kOff) return false;
  return mode == ComputeWeightsMode::kKept || (mode == ComputeWeightsMode::kAuto && !evicting_budget);
}

// training.gradient_dtype: the type the weights' gradients are kept, accumulated, reduced and
// stepped from. fp32 (the fp32 weights' own: 4 bytes a parameter, accumulation in fp32), or bf16
// under bf16 precision (ZeRO's 16-bit gradients: 2 bytes, 2/N sharded, half the bytes on the
// wire; each micro-batch's gradient rounded once as it is added and the sums accumulated in bf16,
// so long accumulation loses low bits); auto: fp32 unless a plan chose bf16 because fp32 did not
// fit a step of one micro-batch (planner/gradient_blocks.h, bf16_gradients_twin). Under fp16 precision the gradients stay fp32 (loss scaling's overflow
// checks would need another type's range).
enum class GradientDtype : uint8_t { kAuto, kFp32, kBf16 };
template <>
struct ChoiceNames<GradientDtype> {
  static constexpr std::pair<GradientDtype, const char*> table[] = {
      {GradientDtype::kAuto, "auto"}, {GradientDtype::kFp32, "fp32"}, {GradientDtype::kBf16, "bf16"}};
};

// Whether the weights' gradients are bf16: asked for under bf16 precision.
inline bool keeps_bf16_gradients(GradientDtype dtype, MixedPrecision precision) {
  return dtype == GradientDtype::kBf16 && precision == MixedPrecision::kBf16;
}

// The type a floating parameter's gradients are kept in where not the parameter's own
// (GradientBuffer's and GradientShards' `floating`); nullopt: its own.
inline std::optional<at::ScalarType> floating_gradient_type(GradientDtype dtype, MixedPrecision precision) {
  if (keeps_bf16_gradients(dtype, precision)) return at::kBFloat16;
  return std::nullopt;
}

// nullopt: fp32 throughout.
inline std::optional<at::ScalarType> autocast_type(MixedPrecision p) {
  switch (p) {
    case MixedPrecision::kBf16: return at::kBFloat16;
    case MixedPrecision::kFp16: return at::kHalf;
    case MixedPrecision::kOff: break;
  }
  return std::nullopt;
}

}  // namespace ht

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

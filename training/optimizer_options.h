#pragma once
// The optimizer and its learning-rate schedule, as the plan carries them ([training]'s keys).

#include "base/choice.h"

#include <cstdint>

namespace ht {

enum class OptimizerKind : uint8_t { kSgd, kAdamw };
template <>
struct ChoiceNames<OptimizerKind> {
  static constexpr std::pair<OptimizerKind, const char*> table[] = {{OptimizerKind::kSgd, "sgd"},
                                                                    {OptimizerKind::kAdamw, "adamw"}};
};
enum class LrSchedule : uint8_t { kConstant, kCosine };
template <>
struct ChoiceNames<LrSchedule> {
  static constexpr std::pair<LrSchedule, const char*> table[] = {{LrSchedule::kConstant, "constant"},
                                                                 {LrSchedule::kCosine, "cosine"}};
};

// The type AdamW keeps its two moments in (training.optimizer_state_dtype): fp32, or bf16 (half
// the bytes, Megatron's --exp-avg-dtype / --exp-avg-sq-dtype): each step widens them, updates in
// fp32 and rounds them back to nearest even.
enum class StateDtype : uint8_t { kFp32, kBf16 };
template <>
struct ChoiceNames<StateDtype> {
  static constexpr std::pair<StateDtype, const char*> table[] = {{StateDtype::kFp32, "fp32"}, {StateDtype::kBf16, "bf16"}};
};

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::kSgd;
  double lr = 0.05;
  double min_lr = 0.0;
  LrSchedule schedule = LrSchedule::kCosine;  // after the warmup: constant, or cosine down to min_lr
  int64_t warmup_steps = 0;                   // linear from lr / warmup_steps
  double momentum = 0.9;                      // sgd
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adamw
  double weight_decay = 0.0;
  double grad_clip = 0.0;  // the global norm's limit; 0: none
  StateDtype state_dtype = StateDtype::kFp32;  // adamw's moments
};

}  // namespace ht

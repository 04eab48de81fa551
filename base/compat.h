#pragma once
// Every difference between the libtorch versions we build against lives here:
// Debian's libtorch 1.13 (CPU, CI) and libtorch 2.x (CUDA, the GPU machine).

#include <ATen/ATen.h>
#include <torch/version.h>

#include <array>
#include <cstring>
#include <optional>
#include <tuple>
#include <vector>

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
// libtorch 2.3 made c10::Allocator::allocate non-const and added a pure copy_data().
#define HT_ALLOCATE_CONST
#define HT_ALLOCATOR_COPY_DATA                                                      \
  void copy_data(void* dest, const void* src, std::size_t count) const override { \
    std::memcpy(dest, src, count);                                                \
  }
// An allocator whose blocks hold no values (meta tensors' storage: alloc/meta_arena.h).
#define HT_ALLOCATOR_NO_COPY_DATA \
  void copy_data(void*, const void*, std::size_t) const override {}
#else
#define HT_ALLOCATE_CONST const
#define HT_ALLOCATOR_COPY_DATA
#define HT_ALLOCATOR_NO_COPY_DATA
#endif

#if TORCH_VERSION_MAJOR >= 2
// libtorch 2.0 can replace its CUDA allocator (torch/csrc/cuda/CUDAPluggableAllocator.h): what a
// budget on a GPU is built on (alloc/cuda_arena.h).
#define HT_CUDA_PLUGGABLE_ALLOCATOR 1
#endif

#if TORCH_VERSION_MAJOR == 1 && TORCH_VERSION_MINOR == 13
// libtorch 1.13's CPU kernels are the ones training/fused_optimizer.cpp reproduces bit for bit
// (another version's AdamW and SGD kernels round otherwise: within rounding there).
#define HT_LIBTORCH_1_13 1
// The CPU kernels' own workspaces (runtime/kernel_workspace.h) were measured against libtorch
// 1.13's ATen and oneDNN; another version's are not declared.
#define HT_CPU_WORKSPACES_MEASURED 1
#endif

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
// libtorch 2.1 has ATen's fused attention kernels with the signatures used below
// (at::_scaled_dot_product_efficient_attention and its backward, at::_fused_sdp_choice).
#define HT_FUSED_ATTENTION 1
#endif

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
// libtorch 2.4 has ATen's multi-tensor AdamW on CUDA (at::_fused_adamw_) taking its optional
// gradient scale as a std::optional (the type c10::optional became in 2.4), and its multi-tensor
// SGD (at::_fused_sgd_, the same way).
#define HT_FUSED_ADAMW_CUDA 1
#define HT_FUSED_SGD_CUDA 1
#endif

namespace ht::compat {

// A private generator for `device`, seeded with `seed`: random ops draw from it so that a
// recomputation replays exactly the same numbers without touching the global generator.
inline at::Generator seeded_generator(const at::Device& device, uint64_t seed) {
  at::Generator gen = at::globalContext().defaultGenerator(device).clone();
  gen.set_current_seed(seed);
  return gen;
}

// Fused attention for runtime/ops/attention.cpp: ATen's memory-efficient kernel, forward and
// backward, which keeps the log-sum-exp instead of the T x S scores as that op does. Taken where
// ATen would run a fused kernel itself (a CUDA flash or memory-efficient choice) for these
// inputs, with H == Hkv and no dropout; elsewhere the op's blockwise kernel runs. Compiled only
// against libtorch >= 2.1 (CI has 1.13); run on the GPU machine (docs/gpu.md).
// Its log-sum-exp is ATen's, (B, H, T) or padded along T, and only its backward reads it.
#ifdef HT_FUSED_ATTENTION
inline bool fused_attention_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    bool causal, double scale) {
  if (!q.is_cuda() || q.scalar_type() == at::kDouble || q.size(1) != k.size(1)) return false;
  // sdp::SDPBackend: 1 flash, 2 memory-efficient, 3 cuDNN. libtorch 2.11 picks cuDNN on an H200
  // for GPT-2's heads (bf16, hd 64), and the blockwise kernel then ran, 3-14x slower than SDPA:
  // inputs that any fused kernel takes, the memory-efficient one (the most general) takes too.
  const int64_t backend = at::_fused_sdp_choice(q, k, v, {}, 0.0, causal, scale);
  return backend == 1 || backend == 2 || backend == 3;
}

// -> (out (B, H, T, hd), log-sum-exp fp32)
inline std::tuple<at::Tensor, at::Tensor> fused_attention_forward(const at::Tensor& q, const at::Tensor& k,
                                                                  const at::Tensor& v, bool causal,
                                                                  double scale) {
  auto r = at::_scaled_dot_product_efficient_attention(q, k, v, {}, /*compute_log_sumexp=*/true,
                                                       /*dropout_p=*/0.0, causal, scale);
  return {std::get<0>(r), std::get<1>(r)};
}

// ATen's memory-efficient backward splits the keys across thread blocks and adds their parts with
// atomics unless determinism is asked for without warn_only, and hybrid_train asks with warn_only
// (runtime/determinism.h: ops with no deterministic variant must still run). The GPU run at
// d4cd665 printed "Memory Efficient attention defaults to a non-deterministic algorithm". For this
// call alone, determinism is made strict, so the kernel takes one key split: the same bits every
// run, as a recomputation under a budget requires.
class StrictDeterminism {
 public:
  StrictDeterminism()
      : active_(at::globalContext().deterministicAlgorithms() && at::globalContext().deterministicAlgorithmsWarnOnly()) {
    if (active_) at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  }
  ~StrictDeterminism() {
    if (active_) at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
  }
  StrictDeterminism(const StrictDeterminism&) = delete;
  StrictDeterminism& operator=(const StrictDeterminism&) = delete;

 private:
  bool active_;
};

// ATen's flash attention (FlashAttention-2), forward and backward: on an H200 at GPT-2's heads
// (bf16, B 32, T 1024, hd 64, causal) 1.8x faster forward and 1.5x faster backward than the
// memory-efficient kernel, and its backward under strict determinism repeats its bits
// (scripts/device-kernels.py, 2026-11-29). Its log-sum-exp is (B, H, T) fp32. For 16-bit inputs
// with hd a multiple of 8 up to 256, on sm80 and newer (runtime/ops/attention.cpp decides).
inline std::tuple<at::Tensor, at::Tensor> flash_attention_forward(const at::Tensor& q, const at::Tensor& k,
                                                                  const at::Tensor& v, bool causal,
                                                                  double scale) {
  auto r = at::_scaled_dot_product_flash_attention(q, k, v, /*dropout_p=*/0.0, causal,
                                                   /*return_debug_mask=*/false, scale);
  return {std::get<0>(r), std::get<1>(r)};
}

// -> (dq, dk, dv); undefined where `needs` is false.
inline std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_attention_backward(
    const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, bool causal, double scale,
    std::array<bool, 3> needs) {
  const at::Tensor no_philox = at::empty({}, at::dtype(at::kLong));  // unread without dropout
  const StrictDeterminism strict;
  auto r = at::_scaled_dot_product_efficient_attention_backward(
      grad.contiguous(), q, k, v, /*attn_bias=*/at::Tensor(), out, lse, no_philox, no_philox,
      /*dropout_p=*/0.0, {needs[0], needs[1], needs[2], false}, causal, scale);
  return {std::get<0>(r), std::get<1>(r), std::get<2>(r)};
}

// -> (dq, dk, dv), all three (flash computes them together). Dense inputs: no cumulative
// sequence lengths; without dropout its random state is never read.
inline std::tuple<at::Tensor, at::Tensor, at::Tensor> flash_attention_backward(
    const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, bool causal, double scale) {
  const at::Tensor no_philox = at::empty({}, at::dtype(at::kLong));
  const StrictDeterminism strict;
  auto r = at::_scaled_dot_product_flash_attention_backward(
      grad.contiguous(), q, k, v, out, lse, /*cum_seq_q=*/at::Tensor(), /*cum_seq_k=*/at::Tensor(),
      q.size(2), k.size(2), /*dropout_p=*/0.0, causal, no_philox, no_philox, scale);
  return {std::get<0>(r), std::get<1>(r), std::get<2>(r)};
}
#else
inline bool fused_attention_applies(const at::Tensor&, const at::Tensor&, const at::Tensor&, bool,
                                    double) {
  return false;
}
inline std::tuple<at::Tensor, at::Tensor> fused_attention_forward(const at::Tensor&, const at::Tensor&,
                                                                  const at::Tensor&, bool, double) {
  TORCH_CHECK(false, "fused attention needs libtorch >= 2.1");
}
inline std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_attention_backward(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    const at::Tensor&, bool, double, std::array<bool, 3>) {
  TORCH_CHECK(false, "fused attention needs libtorch >= 2.1");
}
inline std::tuple<at::Tensor, at::Tensor> flash_attention_forward(const at::Tensor&, const at::Tensor&,
                                                                  const at::Tensor&, bool, double) {
  TORCH_CHECK(false, "flash attention needs libtorch >= 2.1");
}
inline std::tuple<at::Tensor, at::Tensor, at::Tensor> flash_attention_backward(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    const at::Tensor&, bool, double) {
  TORCH_CHECK(false, "flash attention needs libtorch >= 2.1");
}
#endif

// AdamW on CUDA as ATen's multi-tensor kernel (at::_fused_adamw_, what torch.optim.AdamW(fused=True)
// runs): each parameter's gradient, moments and weight read once and written once, 36 tensors a
// launch, the arithmetic in fp32. All tensors contiguous, of one type on one device; `step` is
// every parameter's step count after this step; each gradient is multiplied by `grad_scale` (or,
// where defined, by `scale_on_device`, a 0-dim double on the parameters' GPU, never read by the
// host) as it is read (the kernel divides by a device scalar: by 1 / grad_scale, within a rounding
// of the product) and, where the scale is not 1, written back so (ATen's kernel stores the unscaled
// gradient, as GradScaler's users expect; the trainer zeroes the gradients after the step).
// Returns false, doing nothing, where this libtorch has no such kernel (1.13: CI), and the caller
// steps as torch::optim does.
#ifdef HT_FUSED_ADAMW_CUDA
inline constexpr bool kFusedAdamWOnCuda = true;
inline constexpr bool kFusedSgdOnCuda = true;

// What ATen's fused kernels divide each gradient by (a 0-dim fp32 on the parameters' GPU): the
// reciprocal of the scale, from the host's number or the device's coefficient (1 / it in double,
// rounded to fp32 there: the host's arithmetic); none for a scale of 1.
inline std::optional<at::Tensor> divisor_of(const at::Tensor& param, double grad_scale, const at::Tensor& scale_on_device) {
  if (scale_on_device.defined()) return at::reciprocal(scale_on_device).to(at::kFloat);
  if (grad_scale != 1.0) return at::full({}, 1.0 / grad_scale, param.options().dtype(at::kFloat));
  return std::nullopt;
}
#else
inline constexpr bool kFusedAdamWOnCuda = false;
inline constexpr bool kFusedSgdOnCuda = false;
#endif
inline bool fused_adamw_cuda(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                             at::TensorList exp_avg_sqs, int64_t step, double lr, double beta1,
                             double beta2, double weight_decay, double eps, double grad_scale,
                             const at::Tensor& scale_on_device) {
#ifdef HT_FUSED_ADAMW_CUDA
  if (params.empty()) return true;
  const at::TensorOptions scalar = params[0].options().dtype(at::kFloat);
  // One step count for the whole batch, filled on the device (no copy from the host), read by
  // every tensor's slot.
  const at::Tensor steps = at::full({}, static_cast<double>(step), scalar);
  const std::vector<at::Tensor> state_steps(params.size(), steps);
  at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, state_steps, lr, beta1, beta2,
                    weight_decay, eps, /*amsgrad=*/false, /*maximize=*/false,
                    divisor_of(params[0], grad_scale, scale_on_device), /*found_inf=*/std::nullopt);
  return true;
#else
  (void)params, (void)grads, (void)exp_avgs, (void)exp_avg_sqs, (void)step, (void)lr, (void)beta1, (void)beta2;
  (void)weight_decay, (void)eps, (void)grad_scale, (void)scale_on_device;
  return false;
#endif
}

// SGD on CUDA as ATen's multi-tensor kernel (at::_fused_sgd_, torch.optim.SGD(fused=True)): the
// same conditions and scale as fused_adamw_cuda; `buffers`: the momentum buffers, empty without
// momentum, set to the gradients where `first_step` (torch::optim's first step), else
// momentum x buffer + (1 - dampening) x gradient. The kernel's momentum and update arithmetic is
// in double. Returns false, doing nothing, without the kernel (libtorch < 2.4).
inline bool fused_sgd_cuda(at::TensorList params, at::TensorList grads, at::TensorList buffers, double weight_decay,
                           double momentum, double lr, double dampening, bool nesterov, bool first_step,
                           double grad_scale, const at::Tensor& scale_on_device) {
#ifdef HT_FUSED_SGD_CUDA
  if (params.empty()) return true;
  at::_fused_sgd_(params, grads, buffers, weight_decay, momentum, lr, dampening, nesterov, /*maximize=*/false,
                  first_step, divisor_of(params[0], grad_scale, scale_on_device), /*found_inf=*/std::nullopt);
  return true;
#else
  (void)params, (void)grads, (void)buffers, (void)weight_decay, (void)momentum, (void)lr, (void)dampening;
  (void)nesterov, (void)first_step, (void)grad_scale, (void)scale_on_device;
  return false;
#endif
}

}  // namespace ht::compat

#include "runtime/widening_add.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <cstring>

namespace ht {
namespace {

// target_clones with arch= levels: GCC 12 and later (as training/fused_optimizer.cpp).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define HT_WIDENING_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define HT_WIDENING_CLONES
#endif

// a[i] += float(g[i]) for bf16 g: its 16 bits are the float's upper half.
HT_WIDENING_CLONES void add_bf16_pass(float* a, const uint16_t* g, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(g[i]) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    a[i] += f;
  }
}

// a[i] = bf16(float(a[i]) + g[i]) for a bf16 a and an fp32 g: added in fp32 and rounded once, to
// nearest even with NaN kept quiet (c10::BFloat16's rounding, as ATen's mixed add_ rounds).
HT_WIDENING_CLONES void add_into_bf16_pass(uint16_t* a, const float* g, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(a[i]) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    f += g[i];
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    a[i] = f != f ? uint16_t{0x7FC0} : static_cast<uint16_t>((u + ((u >> 16) & 1) + 0x7FFF) >> 16);
  }
}

constexpr int64_t kGrain = 1 << 15;

bool same_dense_layout(const at::Tensor& a, const at::Tensor& b) {
  return a.device().is_cpu() && b.device().is_cpu() && a.sizes() == b.sizes() && a.strides() == b.strides() &&
         a.is_non_overlapping_and_dense();
}

}  // namespace

void add_widened(at::Tensor& acc, const at::Tensor& g) {
  if (g.scalar_type() == acc.scalar_type()) {
    acc.add_(g);
    return;
  }
  if (acc.scalar_type() == at::kBFloat16 && g.scalar_type() == at::kFloat) {
    // A 16-bit gradient slot (training.gradient_dtype = "bf16") takes an fp32 gradient: one
    // rounding, not a rounding of g and another of the sum. CUDA's add_ and a meta tensor's take
    // the mixed types as they are.
    if (!same_dense_layout(acc, g)) {
      acc.add_(g);
      return;
    }
    auto* a = reinterpret_cast<uint16_t*>(acc.data_ptr<at::BFloat16>());
    const float* b = g.data_ptr<float>();
    at::parallel_for(0, acc.numel(), kGrain,
                     [&](int64_t begin, int64_t end) { add_into_bf16_pass(a + begin, b + begin, end - begin); });
    acc.unsafeGetTensorImpl()->bump_version();
    return;
  }
  const bool one_pass = acc.scalar_type() == at::kFloat && g.scalar_type() == at::kBFloat16 && same_dense_layout(acc, g);
  if (!one_pass) {
    // CUDA's kernels convert as they read; elsewhere convert first (ATen's mixed loop is slower).
    acc.add_(acc.device().is_cuda() ? g : g.to(acc.scalar_type()));
    return;
  }
  float* a = acc.data_ptr<float>();
  const auto* b = reinterpret_cast<const uint16_t*>(g.data_ptr<at::BFloat16>());
  at::parallel_for(0, acc.numel(), kGrain, [&](int64_t begin, int64_t end) { add_bf16_pass(a + begin, b + begin, end - begin); });
  acc.unsafeGetTensorImpl()->bump_version();
}

}  // namespace ht

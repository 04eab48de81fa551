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

constexpr int64_t kGrain = 1 << 15;

}  // namespace

void add_widened(at::Tensor& acc, const at::Tensor& g) {
  if (g.scalar_type() == acc.scalar_type()) {
    acc.add_(g);
    return;
  }
  const bool one_pass = acc.device().is_cpu() && g.device().is_cpu() && acc.scalar_type() == at::kFloat &&
                        g.scalar_type() == at::kBFloat16 && acc.sizes() == g.sizes() && acc.strides() == g.strides() &&
                        acc.is_non_overlapping_and_dense();
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

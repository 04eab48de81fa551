#include "runtime/kernel_cost.h"

#include <algorithm>

namespace ht {
namespace {

bool aliases_an_input(const at::Tensor& out, const std::vector<at::Tensor>& inputs) {
  for (const at::Tensor& in : inputs) {
    if (in.defined() && out.is_alias_of(in)) return true;
  }
  return false;
}

// Attention's two contractions, q k^T and P v, at 2 flops a multiply-add: 4 B H T S hd, from
// q (B, H, T, hd) and k (B, Hkv, S, hd); causal: half (the keys after each query are skipped).
// A context-parallel rank's keys are the group's, key_ranks x S (runtime/op.h); its causal queries
// see half of them too (runtime/context_parallel.h: the head-tail chunks balance the diagonal).
double attention_flops(const std::vector<at::Tensor>& inputs, bool causal, int64_t key_ranks) {
  if (inputs.size() < 2 || inputs[0].dim() != 4 || inputs[1].dim() != 4) return 0;
  const double keys = static_cast<double>(inputs[1].size(2)) * static_cast<double>(key_ranks);
  const double all = 4 * static_cast<double>(inputs[0].numel()) * keys;
  return causal ? all / 2 : all;
}

// `first`: out is the op's first output (attention's work is counted once, on its output, not
// again on its log-sum-exp).
double flops(const OpTraits& traits, const std::vector<at::Tensor>& inputs, const at::Tensor& out,
             bool first) {
  const auto n = static_cast<double>(out.numel());
  switch (traits.work) {
    case Work::kMemory:
      return 0;
    case Work::kContraction:
      return inputs.empty() || inputs[0].dim() == 0 ? 0 : 2 * n * static_cast<double>(inputs[0].size(-1));
    case Work::kConvolution: {
      if (inputs.size() < 2 || inputs[1].dim() == 0 || inputs[1].size(0) == 0) return 0;
      const at::Tensor& w = inputs[1];  // (out_channels, in_channels / groups, kh, kw)
      return 2 * n * static_cast<double>(w.numel() / w.size(0));
    }
    case Work::kAttention:
    case Work::kCausalAttention:
      return first ? attention_flops(inputs, traits.work == Work::kCausalAttention, traits.key_ranks) : 0;
  }
  return 0;
}

}  // namespace

KernelWork kernel_work(const OpTraits& traits, const std::vector<at::Tensor>& inputs,
                       const std::vector<at::Tensor>& outputs) {
  KernelWork w;
  double written = 0;
  for (size_t j = 0; j < outputs.size(); ++j) {
    const at::Tensor& out = outputs[j];
    if (!out.defined() || aliases_an_input(out, inputs)) continue;
    written += static_cast<double>(out.nbytes());
    w.flops += flops(traits, inputs, out, j == 0);
  }
  const at::Tensor* first_float = nullptr;
  const at::Tensor* out0 = !outputs.empty() && outputs[0].defined() ? &outputs[0] : nullptr;
  for (const at::Tensor& in : inputs) {
    if (!in.defined()) continue;
    if (first_float == nullptr && in.is_floating_point()) first_float = &in;
    if (out0 != nullptr) w.broadcasts |= in.numel() < out0->numel();
    w.bytes += static_cast<double>(in.nbytes());
  }
  if (first_float != nullptr) w.dtype = first_float->scalar_type();
  w.input_bytes = w.bytes;
  const bool sixteen_bit = w.dtype == at::kBFloat16 || w.dtype == at::kHalf;
  if (traits.work == Work::kContraction && sixteen_bit) {
    auto odd = [](const at::Tensor& t) { return t.defined() && t.dim() > 0 && t.size(-1) % 8 != 0; };
    w.misaligned = std::any_of(inputs.begin(), inputs.end(), odd) || std::any_of(outputs.begin(), outputs.end(), odd);
  }
  const bool attention = traits.work == Work::kAttention || traits.work == Work::kCausalAttention;
  if (attention && !inputs.empty() && inputs[0].defined() && inputs[0].dim() >= 2) {
    w.attention_length = inputs[0].size(-2);
  }
  // Elementwise in one type and out in another: a cast, not a reduction to an fp32 scalar.
  if (traits.work == Work::kMemory && first_float != nullptr && out0 != nullptr && out0->is_floating_point() &&
      out0->scalar_type() != w.dtype) {
    w.converts = first_float->numel() == out0->numel();
  }
  w.views_only = written == 0;
  if (w.views_only) w.bytes = 0;
  w.bytes = (w.bytes + written) * traits.bytes_factor;
  return w;
}

double modeled_kernel_ms(const OpTraits& traits, const std::vector<at::Tensor>& inputs,
                         const std::vector<at::Tensor>& outputs) {
  return modeled_kernel_ms(traits, kernel_work(traits, inputs, outputs));
}

double modeled_kernel_ms(const OpTraits& traits, const KernelWork& w) {
  if (w.views_only) return 0;
  const double moving = w.bytes / kModeledBytesPerMs;
  return w.flops / kModeledFlopsPerMs + (traits.random ? kModeledRandomFactor * moving : moving);
}

}  // namespace ht

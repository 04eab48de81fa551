#include "runtime/kernel_cost.h"

namespace ht {
namespace {

bool aliases_an_input(const at::Tensor& out, const std::vector<at::Tensor>& inputs) {
  for (const at::Tensor& in : inputs) {
    if (in.defined() && out.is_alias_of(in)) return true;
  }
  return false;
}

double flops(const OpTraits& traits, const std::vector<at::Tensor>& inputs, const at::Tensor& out) {
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
  }
  return 0;
}

}  // namespace

double modeled_kernel_ms(const OpTraits& traits, const std::vector<at::Tensor>& inputs,
                         const std::vector<at::Tensor>& outputs) {
  double written = 0, work = 0;
  for (const at::Tensor& out : outputs) {
    if (!out.defined() || aliases_an_input(out, inputs)) continue;
    written += static_cast<double>(out.nbytes());
    work += flops(traits, inputs, out);
  }
  if (written == 0) return 0;  // views only
  double read = 0;
  for (const at::Tensor& in : inputs) {
    if (in.defined()) read += static_cast<double>(in.nbytes());
  }
  const double moving = (read + written) / kModeledBytesPerMs;
  return work / kModeledFlopsPerMs + (traits.random ? kModeledRandomFactor * moving : moving);
}

}  // namespace ht

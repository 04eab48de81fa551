#include "alloc/gradient_buffer.h"

#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <utility>

namespace ht {

GradientBuffer::GradientBuffer(const std::vector<at::Tensor>& params, std::optional<at::ScalarType> floating) {
  std::map<std::pair<int, std::string>, std::vector<const at::Tensor*>> groups;
  for (const at::Tensor& p : params) {
    if (p.requires_grad()) groups[{static_cast<int>(gradient_type_of(p, floating)), p.device().str()}].push_back(&p);
  }
  for (const auto& [key, members] : groups) {
    int64_t numel = 0;
    for (const at::Tensor* p : members) numel += p->numel();
    const auto type = static_cast<at::ScalarType>(key.first);
    at::Tensor block = at::empty({numel}, members.front()->options().dtype(type).requires_grad(false));
    int64_t offset = 0;
    for (const at::Tensor* p : members) {
      // The slot has its parameter's layout (channels-last convolution weights too), so a
      // gradient reads the same with or without the buffer, reductions over it included.
      TORCH_CHECK(p->is_non_overlapping_and_dense(), "GradientBuffer: a parameter with gaps in its layout");
      at::Tensor view = block.narrow(0, offset, p->numel()).as_strided(p->sizes(), p->strides());
      slots_.emplace(p->unsafeGetTensorImpl(), Slot{std::move(view), blocks_.size(), offset});
      offset += p->numel();
    }
    blocks_.push_back(std::move(block));
  }
}

at::Tensor gradient_norm(const at::Tensor& grad) {
  if (grad.scalar_type() == at::kBFloat16 && grad.is_cpu() && grad.is_contiguous()) {
    // One pass over the bits, the squares summed in double in element order: no fp32 copy of the
    // gradient (ATen's norm with an fp32 result makes one on the CPU), the same bits on every rank.
    const auto* x = reinterpret_cast<const uint16_t*>(grad.data_ptr<at::BFloat16>());
    double sum = 0;
    for (int64_t i = 0, n = grad.numel(); i < n; ++i) {
      const uint32_t bits = static_cast<uint32_t>(x[i]) << 16;
      float f;
      std::memcpy(&f, &bits, sizeof f);
      sum += static_cast<double>(f) * static_cast<double>(f);
    }
    return at::scalar_tensor(std::sqrt(sum), grad.options().dtype(at::kDouble));
  }
  const bool narrow = grad.scalar_type() == at::kBFloat16 || grad.scalar_type() == at::kHalf;
  return narrow ? at::norm(grad, 2, at::kFloat) : grad.norm();
}

at::Tensor GradientBuffer::slot(const at::Tensor& param) const {
  auto it = slots_.find(param.unsafeGetTensorImpl());
  return it == slots_.end() ? at::Tensor() : it->second.view;
}

at::Tensor GradientBuffer::span(const std::vector<at::Tensor>& params) const {
  if (params.empty()) return {};
  size_t block = 0;
  int64_t first = 0, end = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    auto it = slots_.find(params[i].unsafeGetTensorImpl());
    if (it == slots_.end()) return {};
    const Slot& s = it->second;
    if (i == 0) {
      block = s.block;
      first = s.offset;
    } else if (s.block != block || s.offset != end) {
      return {};
    }
    end = s.offset + s.view.numel();
  }
  return blocks_[block].narrow(0, first, end - first);
}

}  // namespace ht

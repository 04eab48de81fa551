#include "memory/gradient_buffer.h"

#include <ATen/ATen.h>

#include <map>
#include <utility>

namespace ht {

GradientBuffer::GradientBuffer(const std::vector<at::Tensor>& params) {
  std::map<std::pair<int, std::string>, std::vector<const at::Tensor*>> groups;
  for (const at::Tensor& p : params) {
    if (p.requires_grad()) groups[{static_cast<int>(p.scalar_type()), p.device().str()}].push_back(&p);
  }
  for (const auto& [key, members] : groups) {
    int64_t numel = 0;
    for (const at::Tensor* p : members) numel += p->numel();
    at::Tensor block = at::empty({numel}, members.front()->options().requires_grad(false));
    int64_t offset = 0;
    for (const at::Tensor* p : members) {
      slots_.emplace(p->unsafeGetTensorImpl(), block.narrow(0, offset, p->numel()).view(p->sizes()));
      offset += p->numel();
    }
    blocks_.push_back(std::move(block));
  }
}

at::Tensor GradientBuffer::slot(const at::Tensor& param) const {
  auto it = slots_.find(param.unsafeGetTensorImpl());
  return it == slots_.end() ? at::Tensor() : it->second;
}

}  // namespace ht

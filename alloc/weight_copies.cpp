#include "alloc/weight_copies.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <string>

namespace ht {

at::Tensor WeightCopies::copy_of(const at::Tensor& weight, at::ScalarType dtype) {
  const Key key{weight.unsafeGetTensorImpl(), dtype};
  auto it = slots_.find(key);
  if (it == slots_.end()) {
    if (!blocks_.empty()) return {};  // not cast in the first step: cast at each read
    if (wanted_index_.emplace(key, wanted_.size()).second) wanted_.push_back({weight, dtype});
    return {};
  }
  Slot& s = it->second;
  const int64_t version = static_cast<int64_t>(weight._version());
  if (s.epoch != epoch_ || s.version != version) {
    at::NoGradGuard no_grad;
    s.copy.copy_(weight);
    s.epoch = epoch_;
    s.version = version;
    ++made_;
  }
  return s.copy;
}

void WeightCopies::weights_changed() {
  ++epoch_;
  made_last_step_ = made_;
  made_ = 0;
  if (blocks_.empty() && !wanted_.empty()) lay_out();
}

void WeightCopies::lay_out() {
  // One block per type and device, the copies in the order the first forward cast them.
  std::map<std::pair<int, std::string>, std::vector<const Wanted*>> groups;
  for (const Wanted& w : wanted_) {
    // A weight with gaps in its layout has no slot: it is cast at each read.
    if (w.weight.is_non_overlapping_and_dense()) groups[{static_cast<int>(w.dtype), w.weight.device().str()}].push_back(&w);
  }
  for (const auto& [type, members] : groups) {
    int64_t numel = 0;
    for (const Wanted* w : members) numel += w->weight.numel();
    at::Tensor block = at::empty({numel}, members.front()->weight.options().dtype(members.front()->dtype).requires_grad(false));
    int64_t offset = 0;
    for (const Wanted* w : members) {
      at::Tensor view = block.narrow(0, offset, w->weight.numel()).as_strided(w->weight.sizes(), w->weight.strides());
      slots_.emplace(Key{w->weight.unsafeGetTensorImpl(), w->dtype}, Slot{w->weight, std::move(view)});
      offset += w->weight.numel();
    }
    bytes_ += static_cast<int64_t>(block.nbytes());
    blocks_.push_back(std::move(block));
  }
  wanted_.clear();
  wanted_index_.clear();
}

}  // namespace ht

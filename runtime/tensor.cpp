#include "runtime/tensor.h"

#include "runtime/interpreter.h"

namespace ht {

Tensor::Tensor(std::shared_ptr<TensorInfo> info) : info_(std::move(info)) {
  if (info_) info_->owner->on_handle_acquired(*info_);
}

Tensor::Tensor(const Tensor& other) : info_(other.info_) {
  if (info_) info_->owner->on_handle_acquired(*info_);
}

Tensor& Tensor::operator=(const Tensor& other) {
  if (this != &other) {
    Tensor copy(other);
    *this = std::move(copy);
  }
  return *this;
}

Tensor& Tensor::operator=(Tensor&& other) noexcept {
  if (this != &other) {
    reset();
    info_ = std::move(other.info_);
  }
  return *this;
}

void Tensor::reset() {
  if (!info_) return;
  std::shared_ptr<TensorInfo> info = std::move(info_);
  info->owner->on_handle_released(*info);
}  // `info` may hold the last reference: the record (and its lineage) goes here

int64_t Tensor::size(int64_t dim) const {
  const int64_t n = this->dim();
  if (dim < 0) dim += n;
  TORCH_CHECK(dim >= 0 && dim < n, "Tensor::size: dim out of range for a ", n, "-d tensor");
  return info_->sizes[dim];
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t s : info_->sizes) n *= s;
  return n;
}

const at::Tensor& Tensor::value() const { return info_->owner->materialize(*info_); }

}  // namespace ht

#pragma once
// ht::Tensor: the user-facing handle to a TensorInfo. Holding a handle means "I will read this
// value": when the last handle (user's or tape's) goes, the interpreter drops the data but keeps
// the record while a recomputation may still need it.

#include "runtime/tensor_info.h"

#include <memory>

namespace ht {

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorInfo> info);
  Tensor(const Tensor& other);
  Tensor(Tensor&& other) noexcept = default;
  Tensor& operator=(const Tensor& other);
  Tensor& operator=(Tensor&& other) noexcept;
  ~Tensor() { reset(); }

  void reset();
  bool defined() const { return info_ != nullptr; }
  TensorInfo* info() const { return info_.get(); }
  const std::shared_ptr<TensorInfo>& info_ptr() const { return info_; }
  Interpreter& interp() const { return *info_->owner; }

  at::IntArrayRef sizes() const { return info_->sizes; }
  int64_t size(int64_t dim) const;
  int64_t dim() const { return static_cast<int64_t>(info_->sizes.size()); }
  int64_t numel() const;
  at::ScalarType dtype() const { return info_->dtype; }
  at::Device device() const { return info_->device; }
  at::TensorOptions options() const { return at::TensorOptions().dtype(dtype()).device(device()); }
  bool requires_grad() const { return info_->requires_grad; }

  // The data, regenerated first if it was dropped.
  const at::Tensor& value() const;

 private:
  std::shared_ptr<TensorInfo> info_;
};

}  // namespace ht

// Shape ops (reshape, view, contiguous, transpose, permute, slice, cat, split) and reductions (sum, mean).
// View ops return tensors that share their input's storage; the interpreter notices the alias
// and treats the output as a view of the input's root (docs/engine.md).
#include "runtime/ops/op_util.h"

#include <algorithm>

namespace ht {
namespace {

using TensorList = std::vector<at::Tensor>;

class ReshapeOp final : public Op {
 public:
  ReshapeOp(std::vector<int64_t> shape, bool must_view)
      : Op(OpTraits::named(must_view ? "view" : "reshape")), shape_(std::move(shape)),
        must_view_(must_view) {}

  TensorList forward(const TensorList& in, const ForwardContext&) const override {
    return {must_view_ ? in[0].view(shape_) : in[0].reshape(shape_)};
  }
  TensorList backward(const BackwardArgs& a) const override {
    return {a.grad_outputs[0].reshape(a.input_sizes(0))};
  }

 private:
  std::vector<int64_t> shape_;
  bool must_view_;
};

// A dense copy of a strided view, or the view itself (an alias) when it is dense already. What
// a view that outlives its base's other uses needs: saved for backward, a slice keeps its whole
// base alive; its copy keeps only itself.
class ContiguousOp final : public Op {
 public:
  ContiguousOp() : Op(OpTraits::named("contiguous")) {}
  TensorList forward(const TensorList& in, const ForwardContext&) const override { return {in[0].contiguous()}; }
  TensorList backward(const BackwardArgs& a) const override { return {a.grad_outputs[0]}; }
};

// Transpose is a permutation of two dimensions.
class PermuteOp final : public Op {
 public:
  explicit PermuteOp(std::vector<int64_t> dims)
      : Op(OpTraits::named("permute")), dims_(std::move(dims)), inverse_(dims_.size()) {
    for (size_t i = 0; i < dims_.size(); ++i) inverse_[dims_[i]] = static_cast<int64_t>(i);
  }

  TensorList forward(const TensorList& in, const ForwardContext&) const override {
    return {in[0].permute(dims_)};
  }
  TensorList backward(const BackwardArgs& a) const override {
    return {a.grad_outputs[0].permute(inverse_)};
  }

 private:
  std::vector<int64_t> dims_, inverse_;
};

class SliceOp final : public Op {
 public:
  SliceOp(int64_t dim, int64_t start, int64_t end, int64_t step)
      : Op(OpTraits::named("slice").writing_its_input_in_backward()), dim_(dim), start_(start), end_(end),
        step_(step) {}

  TensorList forward(const TensorList& in, const ForwardContext&) const override {
    return {in[0].slice(dim_, start_, end_, step_)};
  }
  TensorList backward(const BackwardArgs& a) const override {
    return {at::slice_backward(a.grad_outputs[0], a.input_sizes(0), dim_, start_, end_, step_)};
  }

 private:
  int64_t dim_, start_, end_, step_;
};

class CatOp final : public Op {
 public:
  explicit CatOp(int64_t dim) : Op(OpTraits::named("cat")), dim_(dim) {}

  TensorList forward(const TensorList& in, const ForwardContext&) const override {
    return {at::cat(in, dim_)};
  }
  TensorList backward(const BackwardArgs& a) const override {
    TensorList grads(a.input_infos.size());
    int64_t offset = 0;
    for (size_t i = 0; i < grads.size(); ++i) {
      const int64_t len = a.input_sizes(i)[dim_];
      if (a.needs_input_grad[i]) grads[i] = a.grad_outputs[0].narrow(dim_, offset, len);
      offset += len;
    }
    return grads;
  }

 private:
  int64_t dim_;
};

// One output per piece; a piece that received no gradient contributes zeros. Backward writes the
// input's gradient once (one cat), where slices of it would each write a zero-filled whole and
// the tape would add them.
class SplitOp final : public Op {
 public:
  SplitOp(std::vector<int64_t> sizes, int64_t dim)
      : Op(OpTraits::named("split").writing_its_input_in_backward()), sizes_(std::move(sizes)), dim_(dim) {}

  TensorList forward(const TensorList& in, const ForwardContext&) const override {
    auto pieces = at::split_with_sizes(in[0], sizes_, dim_);
    return TensorList(pieces.begin(), pieces.end());
  }
  TensorList backward(const BackwardArgs& a) const override {
    TensorList parts;
    for (size_t j = 0; j < a.grad_outputs.size(); ++j) {
      if (a.grad_outputs[j].defined()) {
        parts.push_back(a.grad_outputs[j]);
        continue;
      }
      std::vector<int64_t> sizes(a.input_sizes(0).begin(), a.input_sizes(0).end());
      sizes[dim_] = sizes_[j];
      parts.push_back(at::zeros(sizes, a.input_options(0)));
    }
    return {at::cat(parts, dim_)};
  }

 private:
  std::vector<int64_t> sizes_;
  int64_t dim_;
};

// sum or mean over `dims` (all dimensions when empty).
class ReduceOp final : public Op {
 public:
  ReduceOp(std::vector<int64_t> dims, bool keepdim, bool mean)
      : Op(OpTraits::named(mean ? "mean" : "sum").in_float32()), dims_(std::move(dims)), keepdim_(keepdim),
        mean_(mean) {}

  TensorList forward(const TensorList& in, const ForwardContext&) const override {
    if (dims_.empty()) return {mean_ ? in[0].mean() : in[0].sum()};
    return {mean_ ? in[0].mean(dims_, keepdim_) : in[0].sum(dims_, keepdim_)};
  }

  TensorList backward(const BackwardArgs& a) const override {
    const auto sizes = a.input_sizes(0);
    at::Tensor g = a.grad_outputs[0];
    int64_t count = 1;
    if (dims_.empty()) {
      for (int64_t s : sizes) count *= s;
    } else {
      std::vector<int64_t> dims = dims_;
      std::sort(dims.begin(), dims.end());
      for (int64_t d : dims) {
        if (!keepdim_) g = g.unsqueeze(d);
        count *= sizes[d];
      }
    }
    g = g.expand(sizes);
    return {mean_ ? g / count : g};
  }

 private:
  std::vector<int64_t> dims_;
  bool keepdim_, mean_;
};

std::vector<int64_t> normalized(std::vector<int64_t> dims, int64_t ndim) {
  for (int64_t& d : dims) {
    d = detail::normalize_dim(d, ndim);
    TORCH_CHECK(d >= 0 && d < ndim, "dimension out of range for a ", ndim, "-d tensor");
  }
  return dims;
}

}  // namespace

Tensor reshape(const Tensor& x, std::vector<int64_t> shape) {
  return detail::apply_first(std::make_shared<ReshapeOp>(std::move(shape), false), {x});
}

Tensor contiguous(const Tensor& x) {
  static const auto op = std::make_shared<ContiguousOp>();
  return detail::apply_first(op, {x});
}

Tensor view(const Tensor& x, std::vector<int64_t> shape) {
  return detail::apply_first(std::make_shared<ReshapeOp>(std::move(shape), true), {x});
}

Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  std::vector<int64_t> dims(x.dim());
  for (int64_t i = 0; i < x.dim(); ++i) dims[i] = i;
  auto d = normalized({dim0, dim1}, x.dim());
  std::swap(dims[d[0]], dims[d[1]]);
  return permute(x, std::move(dims));
}

Tensor permute(const Tensor& x, std::vector<int64_t> dims) {
  TORCH_CHECK(static_cast<int64_t>(dims.size()) == x.dim(), "permute: ", dims.size(),
              " dims for a ", x.dim(), "-d tensor");
  return detail::apply_first(std::make_shared<PermuteOp>(normalized(std::move(dims), x.dim())),
                             {x});
}

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  TORCH_CHECK(step > 0, "slice: step must be positive");
  dim = normalized({dim}, x.dim())[0];
  const int64_t n = x.size(dim);
  auto clamp = [n](int64_t i) { return std::clamp(i < 0 ? i + n : i, int64_t{0}, n); };
  return detail::apply_first(std::make_shared<SliceOp>(dim, clamp(start), clamp(end), step), {x});
}

Tensor cat(const std::vector<Tensor>& xs, int64_t dim) {
  TORCH_CHECK(!xs.empty(), "cat: no tensors");
  return detail::apply_first(std::make_shared<CatOp>(normalized({dim}, xs[0].dim())[0]), xs);
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  TORCH_CHECK(split_size > 0, "split: split_size must be positive");
  dim = normalized({dim}, x.dim())[0];
  std::vector<int64_t> sizes;
  for (int64_t at = 0, total = x.size(dim); at < total; at += split_size) {
    sizes.push_back(std::min(split_size, total - at));
  }
  return x.interp().apply(std::make_shared<SplitOp>(std::move(sizes), dim), {x});
}

std::vector<Tensor> split(const Tensor& x, std::vector<int64_t> sizes, int64_t dim) {
  dim = normalized({dim}, x.dim())[0];
  int64_t total = 0;
  for (int64_t n : sizes) {
    TORCH_CHECK(n >= 0, "split: sizes must not be negative, got ", n);
    total += n;
  }
  TORCH_CHECK(total == x.size(dim), "split: sizes add up to ", total, ", the dimension has ", x.size(dim));
  return x.interp().apply(std::make_shared<SplitOp>(std::move(sizes), dim), {x});
}

Tensor sum(const Tensor& x) {
  return detail::apply_first(std::make_shared<ReduceOp>(std::vector<int64_t>{}, false, false), {x});
}
Tensor sum(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  TORCH_CHECK(!dims.empty(), "sum: no dims given; use sum(x) to reduce everything");
  return detail::apply_first(
      std::make_shared<ReduceOp>(normalized(std::move(dims), x.dim()), keepdim, false), {x});
}
Tensor mean(const Tensor& x) {
  return detail::apply_first(std::make_shared<ReduceOp>(std::vector<int64_t>{}, false, true), {x});
}
Tensor mean(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  TORCH_CHECK(!dims.empty(), "mean: no dims given; use mean(x) to reduce everything");
  return detail::apply_first(
      std::make_shared<ReduceOp>(normalized(std::move(dims), x.dim()), keepdim, true), {x});
}

}  // namespace ht

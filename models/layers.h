#pragma once
// Parameterized layers: libtorch modules holding the parameters, forward on the interpreter.
// Initialization follows PyTorch's defaults unless a model overrides it.

#include "runtime/interpreter.h"
#include "runtime/ops.h"

#include <torch/nn/module.h>

namespace ht {

// Where layers make their parameters and buffers: host memory (the default; a model moves to its
// device after), or the meta device while a MetaParametersScope lives on this thread: shapes and
// dtypes without values, so that a model of any size is built in no memory and a step of it
// traced (launcher/planning/meta_trace.h).
at::TensorOptions parameter_options();
class MetaParametersScope {
 public:
  MetaParametersScope();
  ~MetaParametersScope();
  MetaParametersScope(const MetaParametersScope&) = delete;
  MetaParametersScope& operator=(const MetaParametersScope&) = delete;

 private:
  bool previous_;
};

// The interpreter handle of a parameter, in the interpreter that `like` lives in.
inline Tensor param_like(const Tensor& like, const at::Tensor& p) { return like.interp().param(p); }

class Linear : public torch::nn::Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Tensor forward(const Tensor& x);  // (..., in) -> (..., out)
  at::Tensor weight;                // (out, in)
  at::Tensor bias;                  // (out) or undefined
};

class Conv2d : public torch::nn::Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t stride = 1,
         int64_t padding = 0, int64_t groups = 1, bool bias = true);
  Tensor forward(const Tensor& x);  // (B, C_in, H, W) -> (B, C_out, H', W')
  at::Tensor weight;                // (C_out, C_in/groups, k, k)
  at::Tensor bias;                  // (C_out) or undefined
  Conv2dArgs args;
};

// Batch statistics in training (running statistics updated once per call), running statistics
// in evaluation. With data parallelism the statistics are per rank.
class BatchNorm2d : public torch::nn::Module {
 public:
  explicit BatchNorm2d(int64_t channels, double momentum = 0.1, double eps = 1e-5);
  Tensor forward(const Tensor& x);  // (B, C, ...) -> same
  at::Tensor weight, bias;          // (C)
  at::Tensor running_mean, running_var, num_batches_tracked;
  double momentum, eps;
};

class LayerNorm : public torch::nn::Module {
 public:
  explicit LayerNorm(int64_t features, double eps = 1e-5);
  Tensor forward(const Tensor& x);  // (..., D) -> same
  at::Tensor weight, bias;          // (D)
  double eps;
};

class Embedding : public torch::nn::Module {
 public:
  Embedding(int64_t num_embeddings, int64_t dim);
  Tensor forward(const Tensor& indices);  // (...) int64 -> (..., D)
  at::Tensor weight;                      // (V, D)
};

}  // namespace ht

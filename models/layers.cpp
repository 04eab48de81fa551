#include "models/layers.h"

#include <torch/nn/init.h>

#include <cmath>

namespace ht {
namespace {

// PyTorch's default for Linear and Conv: kaiming_uniform(a=sqrt(5)) weights, U(-1/sqrt(fan_in),
// 1/sqrt(fan_in)) biases.
void init_default(at::Tensor& weight, at::Tensor& bias, int64_t fan_in) {
  at::NoGradGuard no_grad;
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    bias.uniform_(-bound, bound);
  }
}

thread_local bool t_meta_parameters = false;

}  // namespace

at::TensorOptions parameter_options() {
  return t_meta_parameters ? at::TensorOptions().device(at::kMeta) : at::TensorOptions();
}

MetaParametersScope::MetaParametersScope() : previous_(t_meta_parameters) { t_meta_parameters = true; }
MetaParametersScope::~MetaParametersScope() { t_meta_parameters = previous_; }

Linear::Linear(int64_t in_features, int64_t out_features, bool with_bias) {
  weight = register_parameter("weight", at::empty({out_features, in_features}, parameter_options()));
  if (with_bias) bias = register_parameter("bias", at::empty({out_features}, parameter_options()));
  init_default(weight, bias, in_features);
}

Tensor Linear::forward(const Tensor& x) {
  return linear(x, param_like(x, weight), bias.defined() ? param_like(x, bias) : Tensor());
}

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t stride,
               int64_t padding, int64_t groups, bool with_bias)
    : args{{stride, stride}, {padding, padding}, {1, 1}, groups} {
  TORCH_CHECK(in_channels % groups == 0 && out_channels % groups == 0,
              "Conv2d: channels must be divisible by groups");
  weight = register_parameter("weight",
                              at::empty({out_channels, in_channels / groups, kernel, kernel}, parameter_options()));
  if (with_bias) bias = register_parameter("bias", at::empty({out_channels}, parameter_options()));
  init_default(weight, bias, in_channels / groups * kernel * kernel);
}

Tensor Conv2d::forward(const Tensor& x) {
  return conv2d(x, param_like(x, weight), bias.defined() ? param_like(x, bias) : Tensor(), args);
}

BatchNorm2d::BatchNorm2d(int64_t channels, double momentum_in, double eps_in)
    : momentum(momentum_in), eps(eps_in) {
  weight = register_parameter("weight", at::ones({channels}, parameter_options()));
  bias = register_parameter("bias", at::zeros({channels}, parameter_options()));
  running_mean = register_buffer("running_mean", at::zeros({channels}, parameter_options()));
  running_var = register_buffer("running_var", at::ones({channels}, parameter_options()));
  num_batches_tracked = register_buffer("num_batches_tracked", at::zeros({}, parameter_options().dtype(at::kLong)));
}

Tensor BatchNorm2d::forward(const Tensor& x) {
  if (is_training()) {
    at::NoGradGuard no_grad;
    num_batches_tracked.add_(1);
  }
  return batch_norm(x, param_like(x, weight), param_like(x, bias), running_mean, running_var,
                    is_training(), momentum, eps);
}

LayerNorm::LayerNorm(int64_t features, double eps_in) : eps(eps_in) {
  weight = register_parameter("weight", at::ones({features}, parameter_options()));
  bias = register_parameter("bias", at::zeros({features}, parameter_options()));
}

Tensor LayerNorm::forward(const Tensor& x) {
  return layer_norm(x, {weight.size(0)}, param_like(x, weight), param_like(x, bias), eps);
}

Embedding::Embedding(int64_t num_embeddings, int64_t dim) {
  weight = register_parameter("weight", at::randn({num_embeddings, dim}, parameter_options()));
}

Tensor Embedding::forward(const Tensor& indices) {
  return embedding(param_like(indices, weight), indices);
}

}  // namespace ht

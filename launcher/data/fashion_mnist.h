#pragma once
// Fashion-MNIST (Xiao et al. 2017) from its idx files, gzip-compressed or not, as Debian's
// dataset-fashion-mnist installs them under /usr/share/datasets/fashion-mnist.

#include <ATen/ATen.h>

#include <string>

namespace ht {

constexpr const char* kDefaultFashionMnistDir = "/usr/share/datasets/fashion-mnist";

struct ImageSet {
  at::Tensor images;  // (N, 1, 28, 28) float32, normalized by the training set's mean and std
  at::Tensor labels;  // (N) int64 in [0, 10)
};

// split: "train" (60000 images) or "test" (10000). Throws UserError naming the missing or
// malformed file and what would work.
ImageSet load_fashion_mnist(const std::string& dir, const std::string& split);

}  // namespace ht

#include "launcher/data/synthetic.h"

#include <ATen/CPUGeneratorImpl.h>

namespace ht {
namespace {

at::Generator generator(int64_t seed, uint64_t stream) {
  return at::detail::createCPUGenerator(static_cast<uint64_t>(seed) * 0x9E3779B97F4A7C15ull + stream);
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s;
  for (int64_t v : shape) s += (s.empty() ? "" : "x") + std::to_string(v);
  return s;
}

}  // namespace

// Images (C, H, W): each class is a texture, white noise filtered by the class's own random 3x3
// kernel, so the class lives in local correlations that convolutions (and pooling) can see.
// Other shapes: labels from a fixed random linear teacher over the flattened input.
SyntheticData make_synthetic_images(const DataConfig& d, int64_t seed) {
  const int64_t classes = d.synthetic_classes;
  int64_t features = 1;
  for (int64_t s : d.synthetic_shape) features *= s;
  const bool textures = d.synthetic_shape.size() == 3;
  at::Generator model_gen = generator(seed, 1);
  at::Tensor kernels, teacher;
  if (textures) {
    const int64_t c = d.synthetic_shape[0];
    kernels = at::randn({classes, c, c, 3, 3}, model_gen);
    kernels /= kernels.pow(2).sum({2, 3, 4}, true).sqrt();  // unit gain: images of unit variance
  } else {
    teacher = at::randn({features, classes}, model_gen);
  }
  auto split = [&](int64_t n, uint64_t stream, at::Tensor& x, at::Tensor& y) {
    std::vector<int64_t> shape{n};
    shape.insert(shape.end(), d.synthetic_shape.begin(), d.synthetic_shape.end());
    at::Generator gen = generator(seed, stream);
    if (!textures) {
      x = at::randn(shape, gen);
      y = x.reshape({n, features}).matmul(teacher).argmax(1);
      return;
    }
    y = at::randint(classes, {n}, gen, at::kLong);
    const at::Tensor noise = at::randn(shape, gen);
    x = at::empty(shape);
    for (int64_t k = 0; k < classes; ++k) {
      const at::Tensor members = y.eq(k).nonzero().squeeze(1);
      if (members.numel() == 0) continue;
      x.index_copy_(0, members, at::conv2d(noise.index_select(0, members), kernels[k], {}, 1, 1));
    }
  };
  SyntheticData out;
  split(d.synthetic_samples, 2, out.train_inputs, out.train_targets);
  split(d.synthetic_eval_samples, 3, out.eval_inputs, out.eval_targets);
  out.info = {Task::kClassification, d.synthetic_shape, classes,
              "synthetic " + std::string(textures ? "texture images " : "vectors ") + shape_text(d.synthetic_shape) +
                  ", " + std::to_string(classes) + " classes (" + std::to_string(d.synthetic_samples) + " train, " +
                  std::to_string(d.synthetic_eval_samples) + " eval)"};
  return out;
}

SyntheticData make_synthetic_tokens(const DataConfig& d, int64_t block_size, int64_t seed) {
  const int64_t vocab = d.synthetic_classes;
  at::Generator chain_gen = generator(seed, 4);
  // Peaked transition rows: each token has a few likely successors. A dense vocab x vocab table
  // up to kDenseVocab symbols; above, where it would not fit (GPT-2's 50257 symbols: 10 GB), each
  // token keeps kSuccessors random successors with peaked weights: the same kind of chain in
  // O(vocab) memory.
  constexpr int64_t kDenseVocab = 4096, kSuccessors = 16;
  const bool dense = vocab <= kDenseVocab;
  const at::Tensor transitions = dense ? at::softmax(at::randn({vocab, vocab}, chain_gen) * 3.0, 1)
                                       : at::softmax(at::randn({vocab, kSuccessors}, chain_gen) * 3.0, 1);
  const at::Tensor successors = dense ? at::Tensor() : at::randint(vocab, {vocab, kSuccessors}, chain_gen, at::kLong);
  auto split = [&](int64_t n, uint64_t stream, at::Tensor& x, at::Tensor& y) {
    at::Generator gen = generator(seed, stream);
    at::Tensor seq = at::empty({n, block_size + 1}, at::kLong);
    at::Tensor current = at::randint(vocab, {n}, gen, at::kLong);
    seq.select(1, 0).copy_(current);
    for (int64_t t = 1; t <= block_size; ++t) {
      const at::Tensor pick = at::multinomial(transitions.index_select(0, current), 1, true, gen);
      current = dense ? pick.squeeze(1) : successors.index_select(0, current).gather(1, pick).squeeze(1);
      seq.select(1, t).copy_(current);
    }
    x = seq.narrow(1, 0, block_size).contiguous();
    y = seq.narrow(1, 1, block_size).contiguous();
  };
  SyntheticData out;
  split(d.synthetic_samples, 5, out.train_inputs, out.train_targets);
  split(d.synthetic_eval_samples, 6, out.eval_inputs, out.eval_targets);
  out.info = {Task::kLanguageModel, {block_size}, vocab,
              "synthetic tokens from a fixed Markov chain over " + std::to_string(vocab) + " symbols, " +
                  std::to_string(block_size) + " per sample (" + std::to_string(d.synthetic_samples) + " train, " +
                  std::to_string(d.synthetic_eval_samples) + " eval)"};
  return out;
}

}  // namespace ht

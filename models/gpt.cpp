#include "models/gpt.h"

#include <torch/nn/init.h>

#include <cmath>
#include <limits>

namespace ht {
namespace {

// x = dropout(wte[idx] + wpe[0..T))     idx (B, T) -> x (B, T, D)
class EmbeddingBlock : public Block {
 public:
  explicit EmbeddingBlock(const GptOptions& o)
      : wte(register_module("wte", std::make_shared<Embedding>(o.vocab_size, o.n_embd))),
        wpe(register_module("wpe", std::make_shared<Embedding>(o.block_size, o.n_embd))),
        dropout_(o.dropout), block_size_(o.block_size) {}

  Tensor forward(const Tensor& idx) override {
    const int64_t t = idx.size(1);
    TORCH_CHECK(t <= block_size_, "GPT: sequence length ", t, " exceeds block_size ", block_size_);
    Tensor pos = idx.interp().input(at::arange(t, at::TensorOptions().dtype(at::kLong).device(idx.device())));
    return dropout(add(wte->forward(idx), wpe->forward(pos)), dropout_, is_training());
  }

  std::shared_ptr<Embedding> wte, wpe;

 private:
  double dropout_;
  int64_t block_size_;
};

// Causal multi-head self-attention. x (B, T, D) -> (B, T, D)
class CausalSelfAttention : public torch::nn::Module {
 public:
  explicit CausalSelfAttention(const GptOptions& o)
      : c_attn(register_module("c_attn", std::make_shared<Linear>(o.n_embd, 3 * o.n_embd))),
        c_proj(register_module("c_proj", std::make_shared<Linear>(o.n_embd, o.n_embd))),
        n_head_(o.n_head), dropout_(o.dropout) {}

  Tensor forward(const Tensor& x) {
    const int64_t b = x.size(0), t = x.size(1), d = x.size(2), hd = d / n_head_;
    std::vector<Tensor> qkv = split(c_attn->forward(x), d, 2);  // 3 x (B, T, D)
    auto heads = [&](const Tensor& z) { return transpose(reshape(z, {b, t, n_head_, hd}), 1, 2); };
    Tensor q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);  // (B, H, T, hd)
    qkv.clear();
    Tensor att = mul(matmul(q, transpose(k, -2, -1)), 1.0 / std::sqrt(static_cast<double>(hd)));
    // (T, T), true where position i must not see j > i. Built per call: it is tiny, and a
    // registered bool buffer would be cast by libtorch's Module::to(dtype).
    Tensor mask = x.interp().input(
        at::ones({t, t}, at::TensorOptions().dtype(at::kBool).device(x.device())).triu(1));
    att = masked_fill(att, mask, -std::numeric_limits<double>::infinity());
    att = dropout(softmax(att, -1), dropout_, is_training());  // (B, H, T, T)
    Tensor y = reshape(transpose(matmul(att, v), 1, 2), {b, t, d});
    return dropout(c_proj->forward(y), dropout_, is_training());
  }

  std::shared_ptr<Linear> c_attn;
  std::shared_ptr<Linear> c_proj;

 private:
  int64_t n_head_;
  double dropout_;
};

// x + attn(ln1(x)), then x + mlp(ln2(x)).  (B, T, D) -> (B, T, D)
class TransformerBlock : public Block {
 public:
  explicit TransformerBlock(const GptOptions& o)
      : ln1(register_module("ln1", std::make_shared<LayerNorm>(o.n_embd))),
        attn(register_module("attn", std::make_shared<CausalSelfAttention>(o))),
        ln2(register_module("ln2", std::make_shared<LayerNorm>(o.n_embd))),
        fc(register_module("fc", std::make_shared<Linear>(o.n_embd, 4 * o.n_embd))),
        proj(register_module("proj", std::make_shared<Linear>(4 * o.n_embd, o.n_embd))),
        dropout_(o.dropout) {}

  Tensor forward(const Tensor& x) override {
    Tensor h = add(x, attn->forward(ln1->forward(x)));
    Tensor m = proj->forward(gelu(fc->forward(ln2->forward(h))));
    return add(h, dropout(m, dropout_, is_training()));
  }

  std::shared_ptr<LayerNorm> ln1;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<LayerNorm> ln2;
  std::shared_ptr<Linear> fc;
  std::shared_ptr<Linear> proj;

 private:
  double dropout_;
};

// logits = ln_f(x) @ wte^T.  (B, T, D) -> (B, T, V)
class HeadBlock : public Block {
 public:
  HeadBlock(const GptOptions& o, at::Tensor tied_weight)
      : ln_f_(register_module("ln_f", std::make_shared<LayerNorm>(o.n_embd))),
        wte_(std::move(tied_weight)) {}  // not registered again: one parameter, two uses

  Tensor forward(const Tensor& x) override {
    return linear(ln_f_->forward(x), param_like(x, wte_));
  }
  std::vector<at::Tensor> shared_parameters() const override { return {wte_}; }

 private:
  std::shared_ptr<LayerNorm> ln_f_;
  at::Tensor wte_;
};

}  // namespace

Gpt::Gpt(const GptOptions& o) : options_(o) {
  TORCH_CHECK(o.n_embd % o.n_head == 0, "GPT: n_embd (", o.n_embd, ") must be divisible by n_head (",
              o.n_head, ")");
  auto embed = std::make_shared<EmbeddingBlock>(o);
  at::Tensor wte = embed->wte->weight;
  add_block("embed", embed);
  std::vector<std::shared_ptr<TransformerBlock>> layers;
  for (int64_t i = 0; i < o.n_layer; ++i) {
    layers.push_back(std::make_shared<TransformerBlock>(o));
    add_block("h" + std::to_string(i), layers.back());
  }
  add_block("head", std::make_shared<HeadBlock>(o, wte));

  // GPT-2 initialization: N(0, 0.02), residual projections scaled by 1/sqrt(2 n_layer).
  at::NoGradGuard no_grad;
  for (auto& item : named_parameters()) {
    at::Tensor& p = item.value();
    if (p.dim() >= 2) {
      p.normal_(0.0, 0.02);
    } else if (item.key().find("ln") == std::string::npos) {
      p.zero_();  // biases (layer norms keep weight 1, bias 0)
    }
  }
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(o.n_layer));
  for (auto& layer : layers) {
    layer->attn->c_proj->weight.normal_(0.0, residual_std);
    layer->proj->weight.normal_(0.0, residual_std);
  }
}

Tensor Gpt::loss(const Tensor& output, const Tensor& target) {
  const int64_t v = output.size(-1);
  return cross_entropy(reshape(output, {-1, v}), reshape(target, {-1}));
}

}  // namespace ht

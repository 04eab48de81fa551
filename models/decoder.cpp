#include "models/decoder.h"

#include "models/decoder_split.h"
#include "models/tensor_parallel_plan.h"

#include <cmath>
#include <limits>

namespace ht {
// Named, not anonymous: HeadBlock (declared in decoder.h) holds a Norm and a Split.
namespace decoder_parts {

// The model's place in a tensor-parallel group (models/decoder_split.h): the helpers below are
// the plain layers when the group is one rank.
struct Split {
  int64_t ranks = 1, rank = 0;
  bool sequence = false;  // sequence parallelism: the residual stream holds a piece of the sequence
  ContextLayout context;  // context parallelism: every activation is of this rank's chunks
  explicit Split(const DecoderOptions& o)
      : ranks(o.tensor_parallel), rank(o.tensor_rank), sequence(o.sequence_parallel && o.tensor_parallel > 1),
        context{o.context_parallel, o.context_rank} {}
  bool on() const { return ranks > 1; }

  // A weight read where the sequence is in pieces: each rank's gradient is its piece's part, which
  // f sums over the group (Megatron sums them after backward; here the tape does).
  Tensor replicated(const Tensor& like, const at::Tensor& p) const {
    const Tensor w = param_like(like, p);
    return sequence ? tp_copy(w) : w;
  }
  // A column-parallel layer (its output split by features) from the replicated or sequence-split x.
  Tensor column(const Tensor& x, const Linear& l) const {
    const Tensor w = param_like(x, l.weight), b = l.bias.defined() ? param_like(x, l.bias) : Tensor();
    if (sequence) return tp_gather_linear(x, 1, w, b);
    return linear(on() ? tp_copy(x) : x, w, b);
  }
  // A row-parallel layer (its input split by features): the group's sum, whole or by pieces of
  // the sequence, then the bias.
  Tensor row(const Tensor& x, const Linear& l) const {
    if (!on()) return linear(x, param_like(x, l.weight), l.bias.defined() ? param_like(x, l.bias) : Tensor());
    const Tensor partial = linear(x, param_like(x, l.weight));
    const Tensor y = sequence ? tp_reduce_scatter(partial, 1) : tp_reduce(partial);
    // The bias in the activation's type (under 16-bit autocast the product's, as one rank's
    // linear adds it): an fp32 bias would widen the residual stream.
    return l.bias.defined() ? add(y, cast(replicated(y, l.bias), y.dtype())) : y;
  }
  // A linear layer as the plan split it (PlannedLinear).
  Tensor linear_of(const Tensor& x, ParallelStyle style, const Linear& l) const {
    switch (style) {
      case ParallelStyle::kColumnwise: return column(x, l);
      case ParallelStyle::kRowwise: return row(x, l);
      default:
        return linear(x, replicated(x, l.weight), l.bias.defined() ? replicated(x, l.bias) : Tensor());
    }
  }
  // Dropout where each rank holds a different part of the activation (heads, or a piece of the
  // sequence): its own seed stream, so that the parts' masks differ. Where every rank holds the
  // whole, the one-rank run's stream: the same mask on every rank, the one a single rank draws.
  // Under context parallelism each rank of a context group holds other chunks of the sequence,
  // whose activations are shaped alike: each context rank draws from a stream of its own too
  // (and each tensor rank of it where the tensor-parallel ranks hold parts).
  Tensor dropout(const Tensor& x, double p, bool training, bool parts) const {
    const bool tensor_parts = on() && parts;
    if (!tensor_parts && !context.on()) return ht::dropout(x, p, training);
    const uint64_t stream = !context.on() ? static_cast<uint64_t>(rank) + 1
                                          : 1 + static_cast<uint64_t>(ranks + context.rank * ranks + (tensor_parts ? rank : 0));
    const SeedStream seeds(x.interp(), stream);
    return ht::dropout(x, p, training);
  }
};

// LayerNorm with bias (GPT-2) or RMSNorm (Llama), by the family: one class, so every layer has
// the same parameter names in both.  (..., D) -> same
class Norm : public torch::nn::Module {
 public:
  explicit Norm(const DecoderOptions& o) : rms_(o.is_llama()), eps_(o.norm_eps), split_(o) {
    weight = register_parameter("weight", at::ones({o.n_embd}, parameter_options()));
    if (!rms_) bias = register_parameter("bias", at::zeros({o.n_embd}, parameter_options()));
  }
  Tensor forward(const Tensor& x) {
    const Tensor w = split_.replicated(x, weight);
    return rms_ ? rms_norm(x, w, eps_) : layer_norm(x, {weight.size(0)}, w, split_.replicated(x, bias), eps_);
  }
  at::Tensor weight, bias;

 private:
  bool rms_;
  double eps_;
  Split split_;
};

// Tensor parallelism: a rank keeps only its part of a split parameter from the moment its layer
// makes it (models/decoder_split.h; `name` as the table knows it), so that no rank holds the whole
// model, only one whole tensor at a time; the layer's draws are the one-rank model's.
void keep_part(const DecoderOptions& o, const std::string& name, at::Tensor& p) {
  if (o.tensor_parallel == 1 || !p.defined()) return;
  const ParameterSplit split = decoder_parameter_split(o, name);
  at::NoGradGuard no_grad;
  if (split.split()) p.set_data(part_of(p, split));
}

// A linear layer built as the tensor-parallel plan says (models/tensor_parallel_plan.h): `path`'s
// entry gives its style, and this rank keeps its part of the weights as it makes them. Its forward
// runs that style (Split::linear_of): a layer and its split cannot disagree.
struct PlannedLinear {
  std::shared_ptr<Linear> layer;
  ParallelStyle style = ParallelStyle::kReplicated;
  Tensor forward(const Split& split, const Tensor& x) const { return split.linear_of(x, style, *layer); }
};

// Registers `module`'s layer `name` (`path` in the plan: its block's prefix left out) with `in` and
// `out` features, split as the plan says.
PlannedLinear planned_linear(torch::nn::Module& module, const DecoderOptions& o, const std::string& name,
                             const std::string& path, int64_t in, int64_t out, bool bias) {
  PlannedLinear l;
  l.layer = module.register_module(name, std::make_shared<Linear>(in, out, bias));
  l.style = layer_split_of(o, path).style;
  keep_part(o, path + ".weight", l.layer->weight);
  keep_part(o, path + ".bias", l.layer->bias);
  return l;
}

// x = dropout(wte[idx] (+ wpe[0..T)))     idx (B, T) -> x (B, T, D)
class EmbeddingBlock : public Block {
 public:
  explicit EmbeddingBlock(const DecoderOptions& o)
      : wte(register_module("wte", std::make_shared<Embedding>(o.vocab_size, o.n_embd))),
        options_(o),
        split_(o) {
    keep_part(o, "embed.wte.weight", wte->weight);
    if (!o.is_llama()) wpe = register_module("wpe", std::make_shared<Embedding>(o.block_size, o.n_embd));
  }

  Tensor forward(const Tensor& idx) override {
    const int64_t t = idx.size(1), length = t * split_.context.ranks;  // context parallelism: this rank's part
    TORCH_CHECK(length <= options_.block_size, "decoder: sequence length ", length, " exceeds block_size ",
                options_.block_size);
    Tensor x;
    if (split_.on()) {  // this rank's rows of the vocabulary; the group's sum is the lookup
      const Tensor part = vocab_parallel_embedding(param_like(idx, wte->weight), idx, options_.vocab_first());
      x = split_.sequence ? tp_reduce_scatter(part, 1) : tp_reduce(part);
    } else {
      x = wte->forward(idx);
    }
    if (wpe) {  // the positions of this rank's tokens, and of its piece of them under sequence parallelism
      const int64_t n = split_.sequence ? t / split_.ranks : t, first = split_.sequence ? split_.rank * n : 0;
      const at::Tensor positions = split_.context.positions(length, idx.device()).narrow(0, first, n);
      x = add(x, embedding(split_.replicated(idx, wpe->weight), idx.interp().input(positions)));
    }
    return split_.dropout(x, options_.dropout, is_training(), split_.sequence);
  }

  std::shared_ptr<Embedding> wte, wpe;

 private:
  DecoderOptions options_;
  Split split_;
};

// softmax(q k^T / sqrt(hd), causal) v as separate ops, saving the (B, H, T, T) scores,
// probabilities and dropout mask. q (B, H, T, hd), k and v (B, Hkv, T, hd) -> (B, H, T, hd)
Tensor naive_attention(const Tensor& q, const Tensor& k, const Tensor& v, double dropout_p, bool training) {
  const int64_t b = q.size(0), h = q.size(1), t = q.size(2), hd = q.size(3), groups = h / k.size(1);
  auto repeat = [&](const Tensor& z) {  // (B, Hkv, T, hd) -> (B, H, T, hd), each head `groups` times
    if (groups == 1) return z;
    return reshape(cat(std::vector<Tensor>(groups, reshape(z, {b, k.size(1), 1, t, hd})), 2), {b, h, t, hd});
  };
  Tensor att = mul(matmul(q, transpose(repeat(k), -2, -1)), 1.0 / std::sqrt(static_cast<double>(hd)));
  const Tensor mask = q.interp().input(at::ones({t, t}, at::TensorOptions().dtype(at::kBool).device(q.device())).triu(1));
  att = masked_fill(att, mask, -std::numeric_limits<double>::infinity());
  return matmul(dropout(softmax(att, -1), dropout_p, training), repeat(v));
}

// Causal self-attention, grouped-query when n_kv_heads < n_head.  (B, T, D) -> (B, T, D)
// Queries, keys and values come from one fused projection (GPT-2's c_attn, Megatron's QKV): one
// GEMM, and under autocast one low-precision copy of its input saved for backward instead of
// three, whose gradient the GEMM sums in fp32.
class SelfAttention : public torch::nn::Module {
 public:
  explicit SelfAttention(const DecoderOptions& o) : options_(o), split_(o) {
    const int64_t q = o.n_head * o.head_dim(), kv = o.kv_heads() * o.head_dim();
    const bool bias = !o.is_llama();
    wqkv = planned_linear(*this, o, "wqkv", "attn.wqkv", o.n_embd, q + 2 * kv, bias);
    wo = planned_linear(*this, o, "wo", "attn.wo", q, o.n_embd, bias);
  }

  Tensor forward(const Tensor& x) {
    // This rank's heads: all of them on one rank. With sequence parallelism x is a piece of the
    // sequence and qkv the whole of it.
    const int64_t hd = options_.head_dim();
    const int64_t h = options_.n_head / split_.ranks, hkv = options_.kv_heads() / split_.ranks;
    const Tensor qkv = wqkv.forward(split_, x);  // (B, T, (H + 2 Hkv) hd)
    const int64_t b = qkv.size(0), t = qkv.size(1);
    if (split_.context.on()) {
      const TensorParallelGroup* group = x.interp().context_parallel();
      TORCH_CHECK(group != nullptr && group->size() == split_.context.ranks && group->rank() == split_.context.rank,
                  "decoder: built for rank ", split_.context.rank, " of a context group of ", split_.context.ranks,
                  ", but the interpreter's context-parallel group is not that (Interpreter::set_context_parallel)");
    }
    // One split, not three slices: its backward writes qkv's gradient once (runtime/ops/shape.cpp).
    const std::vector<Tensor> parts = split(qkv, std::vector<int64_t>{h * hd, hkv * hd, hkv * hd}, 2);
    Tensor q = reshape(parts[0], {b, t, h, hd}), k = reshape(parts[1], {b, t, hkv, hd}),
           v = reshape(parts[2], {b, t, hkv, hd});
    if (options_.is_llama()) {
      // Rotated q and k are new tensors; v alone, saved for backward as a view, would keep all
      // of qkv alive (48 of Llama 3 8B's 128-wide heads for its 8): a dense copy keeps 8.
      // Context parallelism: this rank's tokens are pieces of the sequence, at their positions.
      const std::vector<SequencePiece> pieces = split_.context.pieces(t * split_.context.ranks);
      q = rope(q, options_.rope_theta, pieces);
      k = rope(k, options_.rope_theta, pieces);
      v = contiguous(v);
    }
    // (B, H, T, hd) and (B, Hkv, T, hd) in; the op saves O(T) state, never the T x T scores.
    const Tensor qh = transpose(q, 1, 2), kh = transpose(k, 1, 2), vh = transpose(v, 1, 2);
    Tensor y;
    {
      const SeedStream heads_stream(x.interp(), split_.on() ? static_cast<uint64_t>(split_.rank) + 1 : x.interp().seed_stream());
      y = options_.naive_attention ? naive_attention(qh, kh, vh, options_.dropout, is_training())
                                   : context_attention(qh, kh, vh, /*causal=*/true, options_.dropout, is_training(),
                                                       std::nullopt, options_.context_exchange);
    }
    const Tensor merged = reshape(transpose(y, 1, 2), {b, t, h * hd});
    return split_.dropout(wo.forward(split_, merged), options_.dropout, is_training(), split_.sequence);
  }

  PlannedLinear wqkv, wo;

 private:
  DecoderOptions options_;
  Split split_;
};

// GPT-2: proj(gelu_tanh(fc(x))); Llama: w2(silu(gate) * up), [gate | up] = w13(x), Meta's w1
// and w3 fused for the same reason as wqkv.  (B, T, D) -> (B, T, D)
class FeedForward : public torch::nn::Module {
 public:
  explicit FeedForward(const DecoderOptions& o) : options_(o), hidden_(o.mlp_hidden()), split_(o) {
    if (o.is_llama()) {
      w13 = planned_linear(*this, o, "w13", "mlp.w13", o.n_embd, 2 * hidden_, false);
      w2 = planned_linear(*this, o, "w2", "mlp.w2", hidden_, o.n_embd, false);
    } else {
      fc = planned_linear(*this, o, "fc", "mlp.fc", o.n_embd, hidden_, true);
      proj = planned_linear(*this, o, "proj", "mlp.proj", hidden_, o.n_embd, true);
    }
  }

  Tensor forward(const Tensor& x) {
    Tensor y;
    const int64_t f = hidden_ / split_.ranks;  // this rank's part of the hidden width
    if (options_.is_llama()) {
      const Tensor gate_up = w13.forward(split_, x);  // (B, T, 2F): this rank's [gate | up]
      TORCH_CHECK(gate_up.size(2) == 2 * f, "decoder: w13 gave ", gate_up.size(2), " features for 2 x ", f);
      y = w2.forward(split_, swiglu(gate_up));
    } else {
      y = proj.forward(split_, gelu(fc.forward(split_, x), /*tanh_approximation=*/true));
    }
    return split_.dropout(y, options_.dropout, is_training(), split_.sequence);
  }
  // The projection back onto the residual stream (scaled at initialization).
  Linear& out() { return options_.is_llama() ? *w2.layer : *proj.layer; }

  PlannedLinear fc, proj, w13, w2;

 private:
  DecoderOptions options_;
  int64_t hidden_;
  Split split_;
};

// x + attn(attn_norm(x)), then x + mlp(mlp_norm(x)).  (B, T, D) -> (B, T, D)
class DecoderLayer : public Block {
 public:
  explicit DecoderLayer(const DecoderOptions& o)
      : attn_norm(register_module("attn_norm", std::make_shared<Norm>(o))),
        attn(register_module("attn", std::make_shared<SelfAttention>(o))),
        mlp_norm(register_module("mlp_norm", std::make_shared<Norm>(o))),
        mlp(register_module("mlp", std::make_shared<FeedForward>(o))) {}

  Tensor forward(const Tensor& x) override {
    const Tensor h = add(x, attn->forward(attn_norm->forward(x)));
    return add(h, mlp->forward(mlp_norm->forward(h)));
  }

  std::shared_ptr<Norm> attn_norm;
  std::shared_ptr<SelfAttention> attn;
  std::shared_ptr<Norm> mlp_norm;
  std::shared_ptr<FeedForward> mlp;
};

}  // namespace decoder_parts
using namespace decoder_parts;

// logits = norm(x) @ W^T, W the head's own (V, D) or the token embedding's.  (B, T, D) -> (B, T, V)
class HeadBlock : public Block {
 public:
  HeadBlock(const DecoderOptions& o, at::Tensor tied_weight)
      : norm_(register_module("norm", std::make_shared<Norm>(o))), tied_(tied_weight.defined()), split_(o) {
    // A tied weight is not registered again: one parameter, two uses.
    weight_ = tied_ ? std::move(tied_weight) : register_module("lm_head", std::make_shared<Linear>(o.n_embd, o.vocab_size, false))->weight;
    if (!tied_) keep_part(o, "head.lm_head.weight", weight_);
  }

  // One rank: the normalized hidden state (B, T, D), whose logits the loss makes a chunk of rows
  // at a time (Decoder::loss). Split: this rank's columns of the (padded) vocabulary's logits,
  // over the whole sequence.
  Tensor forward(const Tensor& x) override {
    const Tensor normed = norm_->forward(x);
    if (!split_.on()) return normed;
    const Tensor w = param_like(x, weight_);
    if (split_.sequence) return tp_gather_linear(normed, 1, w);
    return linear(tp_copy(normed), w);
  }
  // One rank: the logits of forward's output.
  Tensor logits(const Tensor& normed) const { return linear(normed, param_like(normed, weight_)); }
  // One rank: the mean cross entropy of forward's output (B, T, D) against target (B, T).
  Tensor loss(const Tensor& normed, const Tensor& target) const {
    const int64_t d = normed.size(-1);
    return linear_cross_entropy(reshape(normed, {-1, d}), param_like(normed, weight_), reshape(target, {-1}));
  }
  std::vector<at::Tensor> shared_parameters() const override {
    return tied_ ? std::vector<at::Tensor>{weight_} : std::vector<at::Tensor>{};
  }

 private:
  std::shared_ptr<Norm> norm_;
  bool tied_;
  at::Tensor weight_;
  Split split_;
};

Decoder::Decoder(const DecoderOptions& o) : options_(o) {
  const std::string problem = o.problem();
  TORCH_CHECK(problem.empty(), "decoder: ", problem);
  auto embed = std::make_shared<EmbeddingBlock>(o);
  add_block("embed", embed);
  std::vector<std::shared_ptr<DecoderLayer>> layers;
  for (int64_t i = 0; i < o.n_layer; ++i) {
    layers.push_back(std::make_shared<DecoderLayer>(o));
    add_block("h" + std::to_string(i), layers.back());
  }
  head_ = std::make_shared<HeadBlock>(o, o.tied() ? embed->wte->weight : at::Tensor());
  add_block("head", head_);

  // GPT-2's initialization, which torchtitan's Llama follows in spirit: matrices N(0, 0.02), the
  // projections onto the residual stream N(0, 0.02 / sqrt(2 n_layer)), biases 0, norms 1. A split
  // parameter draws its whole, one tensor at a time, and keeps its part: every layout starts from
  // the one-rank run's weights.
  at::NoGradGuard no_grad;
  auto normal = [&](at::Tensor& p, const std::string& name, double std) {
    const ParameterSplit split = decoder_parameter_split(o, name);
    if (!split.split()) {
      p.normal_(0.0, std);
      return;
    }
    at::Tensor whole = at::empty(whole_sizes_of(o, name, p.sizes().vec()), p.options());
    whole.normal_(0.0, std);
    p.copy_(part_of(whole, split));
  };
  for (auto& item : named_parameters()) {
    at::Tensor& p = item.value();
    if (p.dim() >= 2) {
      normal(p, item.key(), 0.02);
    } else if (item.key().find("norm") == std::string::npos) {
      p.zero_();
    }
  }
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(o.n_layer));
  for (size_t i = 0; i < layers.size(); ++i) {
    const std::string h = "h" + std::to_string(i);
    normal(layers[i]->attn->wo.layer->weight, h + ".attn.wo.weight", residual_std);
    normal(layers[i]->mlp->out().weight, h + (o.is_llama() ? ".mlp.w2.weight" : ".mlp.proj.weight"), residual_std);
  }
}

std::vector<bool> Decoder::split_parameters() const {
  std::vector<bool> out;
  for (const auto& item : named_parameters()) {
    out.push_back(decoder_parameter_split(options_, item.key()).split());
  }
  return out;
}

Tensor Decoder::loss(const Tensor& output, const Tensor& target) {
  if (options_.tensor_parallel > 1) {  // this rank's columns of the logits
    const int64_t v = output.size(-1);
    return vocab_parallel_cross_entropy(reshape(output, {-1, v}), reshape(target, {-1}), options_.vocab_first(),
                                        options_.vocab_rows_valid());
  }
  return head_->loss(output, target);
}

Tensor Decoder::logits(const Tensor& output) { return options_.tensor_parallel > 1 ? output : head_->logits(output); }

}  // namespace ht

#pragma once
#include "models/decoder_options.h"
#include "models/layers.h"
#include "models/model.h"

namespace ht {

// A decoder-only transformer: GPT-2 or the Llama family, by DecoderOptions::family.
// Input (B, T) int64 tokens, T <= block_size; output (B, T, vocab) logits.
// Blocks: "embed" (wte, and GPT-2's wpe), "h0" ... "h{n_layer-1}" (pre-norm layers of causal
// self-attention and an MLP), "head" (final norm and output projection). A tied head uses the
// embedding's weight (Block::shared_parameters): a pipeline that puts the two on different ranks
// keeps the two copies in sync.
//
// Parameter names (what checkpoints and the safetensors export map from):
//   embed.wte.weight (V, D)               embed.wpe.weight (block_size, D)       GPT-2 only
//   h{i}.attn_norm.{weight,bias}          h{i}.mlp_norm.{weight,bias}            bias: GPT-2 only
//   h{i}.attn.wqkv.{weight,bias} ((H + 2 Hkv) hd, D): rows [q | k | v]    h{i}.attn.wo (D, H hd)
//   GPT-2: h{i}.mlp.fc (4D, D), h{i}.mlp.proj (D, 4D), with biases
//   Llama: h{i}.mlp.w13 (2F, D): rows [gate (Meta's w1) | up (w3)], h{i}.mlp.w2 (D, F) down
//   head.norm.{weight,bias}               head.lm_head.weight (V, D)             untied only
// Rotary positions use interleaved pairs (runtime/ops.h, rope): the q and k rows of wqkv are in
// Meta's order, which Hugging Face's checkpoints permute.
class HeadBlock;  // the final norm and the output layer (decoder.cpp)

class Decoder : public Model {
 public:
  explicit Decoder(const DecoderOptions& options);
  // On one rank forward's output is the final norm's (B, T, D), and the loss applies the output
  // layer with the cross entropy, in chunks of rows where the logits are large
  // (linear_cross_entropy): the mean over all B*T positions; target (B, T) int64. Split over a
  // tensor-parallel group, `output` is this rank's columns of the logits (vocabulary-parallel
  // cross entropy).
  Tensor loss(const Tensor& output, const Tensor& target) override;
  Tensor logits(const Tensor& output) override;
  std::vector<bool> split_parameters() const override;
  const DecoderOptions& options() const { return options_; }

 private:
  DecoderOptions options_;
  std::shared_ptr<HeadBlock> head_;
};

}  // namespace ht

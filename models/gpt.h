#pragma once
#include "models/layers.h"
#include "models/model.h"

namespace ht {

struct GptOptions {
  int64_t vocab_size = 256;  // characters
  int64_t block_size = 128;  // longest sequence
  int64_t n_layer = 6;
  int64_t n_head = 8;
  int64_t n_embd = 256;
  double dropout = 0.1;
};

// A decoder-only transformer (GPT-2 layout): token + position embedding, pre-LN blocks of causal
// self-attention and a GELU MLP, final layer norm, output head tied to the token embedding.
// Input (B, T) int64 tokens, T <= block_size; output (B, T, vocab) logits.
// Blocks: the embedding, each transformer block, and the head. The head shares the embedding's
// weight (tied); a pipeline that puts them on different ranks must keep the two copies in sync.
class Gpt : public Model {
 public:
  explicit Gpt(const GptOptions& options);
  // Mean cross entropy over all B*T positions; target (B, T) int64.
  Tensor loss(const Tensor& output, const Tensor& target) override;
  const GptOptions& options() const { return options_; }

 private:
  GptOptions options_;
};

}  // namespace ht

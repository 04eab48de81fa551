#include "models/decoder_options.h"

#include <algorithm>

namespace ht {

namespace {

DecoderOptions shaped(DecoderFamily family, int64_t vocab_size, int64_t block_size, int64_t n_layer, int64_t n_head,
                      int64_t n_embd) {
  DecoderOptions o;
  o.family = family;
  o.vocab_size = vocab_size;
  o.block_size = block_size;
  o.n_layer = n_layer;
  o.n_head = n_head;
  o.n_embd = n_embd;
  return o;
}

}  // namespace

DecoderOptions DecoderOptions::gpt2(int64_t vocab_size, int64_t block_size, int64_t n_layer, int64_t n_head,
                                    int64_t n_embd, double dropout) {
  DecoderOptions o = shaped(DecoderFamily::kGpt2, vocab_size, block_size, n_layer, n_head, n_embd);
  o.dropout = dropout;
  return o;
}

DecoderOptions DecoderOptions::llama(int64_t vocab_size, int64_t block_size, int64_t n_layer, int64_t n_head,
                                     int64_t n_kv_heads, int64_t n_embd) {
  DecoderOptions o = shaped(DecoderFamily::kLlama, vocab_size, block_size, n_layer, n_head, n_embd);
  o.n_kv_heads = n_kv_heads;
  o.tie_embeddings = false;
  return o;
}

// Meta's rule (llama/model.py, FeedForward): int(2 * 4d / 3), times the multiplier, rounded up.
// Llama 3 8B: 4096 -> 10922 -> 14198 (x 1.3) -> 14336 (multiple of 1024).
int64_t DecoderOptions::mlp_hidden() const {
  if (!is_llama()) return 4 * n_embd;
  int64_t hidden = 2 * (4 * n_embd) / 3;
  if (ffn_dim_multiplier > 0) hidden = static_cast<int64_t>(ffn_dim_multiplier * static_cast<double>(hidden));
  const int64_t m = multiple_of > 0 ? multiple_of : 1;
  return m * ((hidden + m - 1) / m);
}

int64_t DecoderOptions::vocab_rows_valid() const {
  const int64_t rows = padded_vocab() / tensor_parallel;
  return std::max<int64_t>(0, std::min(rows, vocab_size - vocab_first()));
}

int64_t DecoderOptions::parameter_count() const {
  const int64_t d = n_embd, hd = head_dim(), q = n_head * hd, kv = kv_heads() * hd, f = mlp_hidden();
  const bool bias = !is_llama();
  const int64_t norm = bias ? 2 * d : d;
  const int64_t attention = d * q + 2 * d * kv + q * d + (bias ? q + 2 * kv + d : 0);
  const int64_t mlp = is_llama() ? 3 * d * f : 2 * d * f + f + d;
  const int64_t layer = 2 * norm + attention + mlp;
  const int64_t embed = vocab_size * d + (is_llama() ? 0 : block_size * d);
  const int64_t head = norm + (tied() ? 0 : vocab_size * d);
  return embed + n_layer * layer + head;
}

DecoderOptions::Diagnosis DecoderOptions::diagnose() const {
  auto str = [](int64_t v) { return std::to_string(v); };
  if (vocab_size < 1 || block_size < 1 || n_layer < 1 || n_head < 1 || n_embd < 1) {
    return {"model.vocab_size, block_size, n_layer, n_head and n_embd must be at least 1",
            {"model.vocab_size", "model.block_size", "model.n_layer", "model.n_head", "model.n_embd"}};
  }
  if (n_embd % n_head != 0) {
    return {"model.n_embd = " + str(n_embd) + " is not a multiple of model.n_head = " + str(n_head) +
                "; choose n_head dividing n_embd",
            {"model.n_head", "model.n_embd"}};
  }
  if (kv_heads() > n_head || n_head % kv_heads() != 0) {
    return {"model.n_head = " + str(n_head) + " is not a multiple of model.n_kv_heads = " + str(kv_heads()) +
                "; choose n_kv_heads dividing n_head",
            {"model.n_kv_heads", "model.n_head"}};
  }
  if (!is_llama() && n_kv_heads != 0 && n_kv_heads != n_head) {
    return {"model.n_kv_heads applies to llama only (GPT-2 has one key/value head per head)", {"model.n_kv_heads"}};
  }
  if (is_llama() && head_dim() % 2 != 0) {
    return {"rotary positions need an even head dimension; model.n_embd / model.n_head is " + str(head_dim()),
            {"model.n_head", "model.n_embd"}};
  }
  if (is_llama() && rope_theta <= 1.0) return {"model.rope_theta must be above 1", {"model.rope_theta"}};
  if (norm_eps <= 0) return {"model.norm_eps must be positive", {"model.norm_eps"}};
  const Diagnosis split = tensor_parallel_diagnosis();
  return split.message.empty() ? context_parallel_diagnosis() : split;
}

DecoderOptions::Diagnosis DecoderOptions::tensor_parallel_diagnosis() const {
  auto str = [](int64_t v) { return std::to_string(v); };
  const int64_t t = tensor_parallel;
  const std::string tp = "parallel.tensor_parallel = " + str(t);
  const std::string tp_key = "parallel.tensor_parallel";
  if (t < 1 || tensor_rank < 0 || tensor_rank >= t) {
    return {tp + " must be at least 1 (rank " + str(tensor_rank) + ")", {tp_key}};
  }
  if (n_head % t != 0) {
    return {"model.n_head = " + str(n_head) + " is not a multiple of " + tp +
                ": attention splits by heads; choose a tensor_parallel dividing n_head",
            {"model.n_head", tp_key}};
  }
  if (kv_heads() % t != 0) {
    return {"model.n_kv_heads = " + str(kv_heads()) + " is not a multiple of " + tp +
                ": key/value heads are split, never replicated; choose a tensor_parallel dividing n_kv_heads",
            {"model.n_kv_heads", tp_key}};
  }
  if (mlp_hidden() % t != 0) {
    return {"the MLP's width " + str(mlp_hidden()) + " (from model.n_embd and model.multiple_of) is not a multiple of " +
                tp + "; choose a multiple_of that tensor_parallel divides",
            {"model.multiple_of", "model.n_embd", tp_key}};
  }
  if (sequence_parallel && t > 1 && block_size % t != 0) {
    return {"model.block_size = " + str(block_size) + " is not a multiple of " + tp +
                ": parallel.sequence_parallel cuts each sequence into tensor_parallel pieces",
            {"model.block_size", tp_key, "parallel.sequence_parallel"}};
  }
  return {};
}

DecoderOptions::Diagnosis DecoderOptions::context_parallel_diagnosis() const {
  auto str = [](int64_t v) { return std::to_string(v); };
  const int64_t c = context_parallel;
  const std::string cp = "parallel.context_parallel = " + str(c), cp_key = "parallel.context_parallel";
  if (c < 1 || context_rank < 0 || context_rank >= c) return {cp + " must be at least 1 (rank " + str(context_rank) + ")", {cp_key}};
  if (c == 1) return {};
  if (block_size % (2 * c) != 0) {
    return {"model.block_size = " + str(block_size) + " is not a multiple of 2 x " + cp +
                ": each rank holds a chunk from the front of each sequence and its mirror from the back; choose a "
                "block_size that 2 x context_parallel divides",
            {"model.block_size", cp_key}};
  }
  if (sequence_parallel && tensor_parallel > 1 && (block_size / c) % tensor_parallel != 0) {
    return {"model.block_size / " + cp + " = " + str(block_size / c) + " is not a multiple of parallel.tensor_parallel = " +
                str(tensor_parallel) + ": sequence parallelism cuts each rank's part of the sequence again",
            {"model.block_size", cp_key, "parallel.tensor_parallel"}};
  }
  if (naive_attention) return {"the composed (naive) attention has no context-parallel form", {cp_key}};
  return {};
}

}  // namespace ht

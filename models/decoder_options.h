#pragma once
// The shape of a decoder-only transformer, as plain data: one set of options serves GPT-2 and
// the Llama family (models/decoder.h builds it). What the shape alone determines (the MLP's
// hidden width by the family's rule, the parameter count) is computed here without building
// anything, so a 70B shape can be printed, checked and refused before a byte is allocated.
//
//                 GPT-2                          Llama (2, 3)
//   positions     learned (wpe)                  rotary (rope_theta), on q and k
//   norm          LayerNorm with bias            RMSNorm, weight only
//   MLP           GELU (tanh), 4 x n_embd        SwiGLU, hidden by ffn_dim_multiplier/multiple_of
//   attention     n_head heads, biases           grouped-query (n_kv_heads), no biases
//   output head   tied to the token embedding    tied or not (tie_embeddings)

#include "base/choice.h"
#include "runtime/context_parallel.h"

#include <cstdint>
#include <string>
#include <vector>

namespace ht {

enum class DecoderFamily : uint8_t { kGpt2, kLlama };
template <>
struct ChoiceNames<DecoderFamily> {
  static constexpr std::pair<DecoderFamily, const char*> table[] = {{DecoderFamily::kGpt2, "gpt"},
                                                                    {DecoderFamily::kLlama, "llama"}};
};

struct DecoderOptions {
  DecoderFamily family = DecoderFamily::kGpt2;
  int64_t vocab_size = 256;
  int64_t block_size = 128;  // longest sequence (GPT-2: rows of the position table)
  int64_t n_layer = 6;
  int64_t n_head = 8;
  int64_t n_kv_heads = 0;  // Llama: key/value heads (grouped-query attention); 0: n_head
  int64_t n_embd = 256;
  // Llama's MLP width: 2/3 of 4 x n_embd, times ffn_dim_multiplier (0: none), rounded up to a
  // multiple of multiple_of. GPT-2's is 4 x n_embd.
  double ffn_dim_multiplier = 0;
  int64_t multiple_of = 256;
  double rope_theta = 10000;  // Llama 2: 10000; Llama 3: 500000
  double norm_eps = 1e-5;
  bool tie_embeddings = true;  // GPT-2 always ties; Llama 3 8B and 70B do not
  double dropout = 0.0;        // GPT-2: embeddings, attention probabilities, residual branches
  // Attention composed of matmul, masked_fill, softmax, dropout and matmul, which saves the
  // T x T scores and probabilities for backward: the baseline of bench/attention.cpp and an
  // oracle in tests. Never from a config: the attention op computes the same function.
  bool naive_attention = false;
  // Tensor parallelism (parallel.tensor_parallel, models/decoder_split.h): the model built is rank
  // `tensor_rank`'s part of one split over `tensor_parallel` ranks: attention by heads (query and
  // key/value heads both: tensor_parallel divides each), the MLP by its hidden width, the
  // embedding and the output layer by the vocabulary, padded to a multiple of tensor_parallel.
  // sequence_parallel: the norms, dropouts and residual stream between the split regions hold
  // this rank's piece of the sequence (block_size / tensor_parallel positions) instead of all of it.
  int64_t tensor_parallel = 1;
  int64_t tensor_rank = 0;
  bool sequence_parallel = false;
  // Context parallelism (parallel.context_parallel, runtime/context_parallel.h): the model runs on
  // rank `context_rank`'s head and tail chunks of each sequence (tokens and labels cut by the
  // trainer), its positions theirs, and attention gathers the group's keys and values. Weights
  // are whole on every rank of the group.
  int64_t context_parallel = 1;
  int64_t context_rank = 0;
  ContextExchange context_exchange = ContextExchange::kRing;  // how attention meets the group's keys and values

  // GPT-2's layout at the given size.
  static DecoderOptions gpt2(int64_t vocab_size, int64_t block_size, int64_t n_layer, int64_t n_head,
                             int64_t n_embd, double dropout);
  // Llama's layout at the given size (multiple_of 256, no multiplier, theta 10000, untied).
  static DecoderOptions llama(int64_t vocab_size, int64_t block_size, int64_t n_layer, int64_t n_head,
                              int64_t n_kv_heads, int64_t n_embd);

  bool is_llama() const { return family == DecoderFamily::kLlama; }
  bool tied() const { return !is_llama() || tie_embeddings; }
  int64_t kv_heads() const { return n_kv_heads > 0 ? n_kv_heads : n_head; }
  int64_t head_dim() const { return n_embd / n_head; }
  int64_t mlp_hidden() const;
  // The vocabulary rounded up to a multiple of tensor_parallel (Megatron's padding: the padded
  // rows are never looked up and their logits take no part in the loss).
  int64_t padded_vocab() const { return (vocab_size + tensor_parallel - 1) / tensor_parallel * tensor_parallel; }
  // This rank's rows of the padded vocabulary begin here; the first vocab_rows_valid() are real.
  int64_t vocab_first() const { return tensor_rank * (padded_vocab() / tensor_parallel); }
  int64_t vocab_rows_valid() const;
  // Every parameter, counted from the shape (a tied matrix once).
  int64_t parameter_count() const;
  // What is wrong with the shape, or empty: widths that do not divide, odd head dimension for
  // rotary positions, head counts that tensor_parallel does not divide, and the like. Keys are
  // named as in [model] and [parallel].
  std::string problem() const { return diagnose().message; }
  std::string tensor_parallel_problem() const { return tensor_parallel_diagnosis().message; }
  // The problem and the keys its message names, in the order it names them (the first is the one
  // a config's error points at: "model.n_kv_heads = 1 is not a multiple of parallel.tensor_parallel
  // = 2" points where n_kv_heads was set, not where n_head was).
  struct Diagnosis {
    std::string message;  // empty: nothing is wrong
    std::vector<std::string> keys;
  };
  Diagnosis diagnose() const;
  Diagnosis tensor_parallel_diagnosis() const;  // the part of diagnose() that tensor_parallel adds
  Diagnosis context_parallel_diagnosis() const;  // the part that context_parallel adds
};

}  // namespace ht

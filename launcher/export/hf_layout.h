#pragma once
// Our decoder's parameters (models/decoder.h documents their names) in Hugging Face
// transformers' layouts, GPT2LMHeadModel and LlamaForCausalLM, and the architecture's
// config.json both ways. This is the one place that knows both sets of names; export and import
// (hf_checkpoint.h) only walk the list it gives.
//
// The differences besides names:
//   GPT-2: Conv1D stores weights [in, out], the transpose of a linear layer's [out, in] (c_attn
//     is our fused wqkv, transposed); the head is tied, so lm_head is not written.
//   Llama: q_proj, k_proj and v_proj are row blocks of our wqkv, gate_proj and up_proj of our
//     w13. Our rotary positions rotate interleaved pairs (2i, 2i+1) of a head (Meta's layout);
//     Hugging Face's rotate_half pairs (i, i + hd/2), and its conversion script permutes the
//     rows of q_proj and k_proj per head to match (see rotary_permute). lm_head.weight is
//     absent when tie_word_embeddings is true.

#include "models/decoder_options.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace ht {

enum class HfTransform : uint8_t {
  kCopy,           // same values
  kTranspose,      // GPT-2's Conv1D weights: [in, out] there, [out, in] here
  kRotaryPermute,  // Llama's q_proj, k_proj: rows permuted per head (interleaved -> halves)
};

// One tensor of the Hugging Face layout and where it comes from here: rows of one of our
// parameters (all of them, or a block of a fused one), transformed.
struct HfTensor {
  std::string name;             // e.g. "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;   // its shape there
  std::string ours;             // our parameter, e.g. "h0.attn.wqkv.weight"
  int64_t row_begin = 0;        // rows [row_begin, row_begin + rows) of it; rows < 0: all
  int64_t rows = -1;
  HfTransform transform = HfTransform::kCopy;
  int64_t heads = 0;            // kRotaryPermute: heads of this projection
};

// Every tensor the Hugging Face checkpoint of a decoder of this shape holds, in the order they
// are written. Computed from the shape alone: a 70B shape costs nothing.
std::vector<HfTensor> hf_tensors(const DecoderOptions& options);

// The rows of `param` (our parameter t.ours) that t is made of: a view, to read or to copy into.
at::Tensor our_rows(const HfTensor& t, const at::Tensor& param);
// Our parameter -> the Hugging Face tensor; the Hugging Face tensor -> our_rows' values.
at::Tensor to_hf(const HfTensor& t, const at::Tensor& param);
at::Tensor from_hf(const HfTensor& t, const at::Tensor& theirs);

// Meta's interleaved rotary rows -> Hugging Face's halves, per head, as
// convert_llama_weights_to_hf.py's permute(w, n_heads, dim1, dim2); `inverse` undoes it.
at::Tensor rotary_permute(const at::Tensor& w, int64_t heads, bool inverse);

// Tensors a published checkpoint may hold that carry no weights of ours: GPT-2's attn.bias and
// attn.masked_bias (causal-mask buffers), Llama's rotary_emb.inv_freq, a tied model's lm_head.
bool hf_ignored(const std::string& name, const DecoderOptions& options);
// A published GPT-2 file names its tensors without GPT2LMHeadModel's "transformer." prefix
// (it was saved from GPT2Model): the name with the prefix, as hf_tensors lists it.
std::string hf_canonical_name(const std::string& name, const DecoderOptions& options);

// The architecture's config.json, with transformers' keys. `dtype`: torch_dtype's value.
nlohmann::json hf_config(const DecoderOptions& options, at::ScalarType dtype);
// The shape a config.json describes; UserError naming `where` and the key when it describes
// something this decoder does not build (another model_type, biases in Llama, rope_scaling...).
DecoderOptions decoder_options_from_hf(const nlohmann::json& config, const std::string& where);
// The [model] keys that set each difference between two shapes, e.g.
// "model.n_kv_heads = 2, model.n_layer = 4" (the values of `wanted`); empty if none.
std::string model_keys_differing(const DecoderOptions& have, const DecoderOptions& wanted);

}  // namespace ht

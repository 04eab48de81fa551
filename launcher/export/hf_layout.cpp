#include "launcher/export/hf_layout.h"

#include "base/user_error.h"

#include <cmath>
#include <sstream>

namespace ht {
namespace hf_layout_impl {

using nlohmann::json;

std::string layer(int64_t i) { return "h" + std::to_string(i) + "."; }

// GPT2LMHeadModel's state dict, in its order; the head is tied to wte and not written.
std::vector<HfTensor> gpt2_tensors(const DecoderOptions& o) {
  const int64_t d = o.n_embd, f = o.mlp_hidden();
  const HfTransform conv1d = HfTransform::kTranspose;
  std::vector<HfTensor> t;
  t.push_back({"transformer.wte.weight", {o.vocab_size, d}, "embed.wte.weight"});
  t.push_back({"transformer.wpe.weight", {o.block_size, d}, "embed.wpe.weight"});
  for (int64_t i = 0; i < o.n_layer; ++i) {
    const std::string p = "transformer.h." + std::to_string(i) + ".", h = layer(i);
    t.push_back({p + "ln_1.weight", {d}, h + "attn_norm.weight"});
    t.push_back({p + "ln_1.bias", {d}, h + "attn_norm.bias"});
    t.push_back({p + "attn.c_attn.weight", {d, 3 * d}, h + "attn.wqkv.weight", 0, -1, conv1d});
    t.push_back({p + "attn.c_attn.bias", {3 * d}, h + "attn.wqkv.bias"});
    t.push_back({p + "attn.c_proj.weight", {d, d}, h + "attn.wo.weight", 0, -1, conv1d});
    t.push_back({p + "attn.c_proj.bias", {d}, h + "attn.wo.bias"});
    t.push_back({p + "ln_2.weight", {d}, h + "mlp_norm.weight"});
    t.push_back({p + "ln_2.bias", {d}, h + "mlp_norm.bias"});
    t.push_back({p + "mlp.c_fc.weight", {d, f}, h + "mlp.fc.weight", 0, -1, conv1d});
    t.push_back({p + "mlp.c_fc.bias", {f}, h + "mlp.fc.bias"});
    t.push_back({p + "mlp.c_proj.weight", {f, d}, h + "mlp.proj.weight", 0, -1, conv1d});
    t.push_back({p + "mlp.c_proj.bias", {d}, h + "mlp.proj.bias"});
  }
  t.push_back({"transformer.ln_f.weight", {d}, "head.norm.weight"});
  t.push_back({"transformer.ln_f.bias", {d}, "head.norm.bias"});
  return t;
}

// LlamaForCausalLM's state dict, in its order: q, k and v are row blocks of our wqkv, gate and
// up of our w13.
std::vector<HfTensor> llama_tensors(const DecoderOptions& o) {
  const int64_t d = o.n_embd, f = o.mlp_hidden(), q = o.n_head * o.head_dim(), kv = o.kv_heads() * o.head_dim();
  const HfTransform rotary = HfTransform::kRotaryPermute, copy = HfTransform::kCopy;
  std::vector<HfTensor> t;
  t.push_back({"model.embed_tokens.weight", {o.vocab_size, d}, "embed.wte.weight"});
  for (int64_t i = 0; i < o.n_layer; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".", h = layer(i);
    t.push_back({p + "self_attn.q_proj.weight", {q, d}, h + "attn.wqkv.weight", 0, q, rotary, o.n_head});
    t.push_back({p + "self_attn.k_proj.weight", {kv, d}, h + "attn.wqkv.weight", q, kv, rotary, o.kv_heads()});
    t.push_back({p + "self_attn.v_proj.weight", {kv, d}, h + "attn.wqkv.weight", q + kv, kv, copy});
    t.push_back({p + "self_attn.o_proj.weight", {d, q}, h + "attn.wo.weight"});
    t.push_back({p + "mlp.gate_proj.weight", {f, d}, h + "mlp.w13.weight", 0, f, copy});
    t.push_back({p + "mlp.up_proj.weight", {f, d}, h + "mlp.w13.weight", f, f, copy});
    t.push_back({p + "mlp.down_proj.weight", {d, f}, h + "mlp.w2.weight"});
    t.push_back({p + "input_layernorm.weight", {d}, h + "attn_norm.weight"});
    t.push_back({p + "post_attention_layernorm.weight", {d}, h + "mlp_norm.weight"});
  }
  t.push_back({"model.norm.weight", {d}, "head.norm.weight"});
  if (!o.tied()) t.push_back({"lm_head.weight", {o.vocab_size, d}, "head.lm_head.weight"});
  return t;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace hf_layout_impl

std::vector<HfTensor> hf_tensors(const DecoderOptions& o) {
  return o.is_llama() ? hf_layout_impl::llama_tensors(o) : hf_layout_impl::gpt2_tensors(o);
}

// transformers/models/llama/convert_llama_weights_to_hf.py ("permute for sliced rotary"):
//   def permute(w, n_heads, dim1=dim, dim2=dim):
//       return w.view(n_heads, dim1 // n_heads // 2, 2, dim2).transpose(1, 2).reshape(dim1, dim2)
// applied to Meta's wq (n_heads) and wk (n_kv_heads): row 2i + j of a head moves to j * hd/2 + i.
at::Tensor rotary_permute(const at::Tensor& w, int64_t heads, bool inverse) {
  const int64_t rows = w.size(0), cols = w.size(1), half = rows / heads / 2;
  TORCH_CHECK(w.dim() == 2 && rows == heads * half * 2, "rotary_permute: ", w.sizes(), " with ", heads, " heads");
  const at::Tensor blocks = inverse ? w.reshape({heads, 2, half, cols}) : w.reshape({heads, half, 2, cols});
  return blocks.transpose(1, 2).reshape({rows, cols});
}

at::Tensor our_rows(const HfTensor& t, const at::Tensor& param) {
  return t.rows < 0 ? param : param.narrow(0, t.row_begin, t.rows);
}

at::Tensor to_hf(const HfTensor& t, const at::Tensor& param) {
  const at::Tensor rows = our_rows(t, param);
  switch (t.transform) {
    case HfTransform::kCopy: return rows;
    case HfTransform::kTranspose: return rows.t();
    case HfTransform::kRotaryPermute: return rotary_permute(rows, t.heads, /*inverse=*/false);
  }
  TORCH_INTERNAL_ASSERT(false, "unknown transform");
  return {};
}

at::Tensor from_hf(const HfTensor& t, const at::Tensor& theirs) {
  switch (t.transform) {
    case HfTransform::kCopy: return theirs;
    case HfTransform::kTranspose: return theirs.t();
    case HfTransform::kRotaryPermute: return rotary_permute(theirs, t.heads, /*inverse=*/true);
  }
  TORCH_INTERNAL_ASSERT(false, "unknown transform");
  return {};
}

bool hf_ignored(const std::string& name, const DecoderOptions& o) {
  using hf_layout_impl::ends_with;
  if (o.is_llama()) return ends_with(name, ".rotary_emb.inv_freq") || (o.tied() && name == "lm_head.weight");
  return ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias") || name == "lm_head.weight";
}

std::string hf_canonical_name(const std::string& name, const DecoderOptions& o) {
  if (o.is_llama() || name.rfind("transformer.", 0) == 0 || name == "lm_head.weight") return name;
  return "transformer." + name;
}

nlohmann::json hf_config(const DecoderOptions& o, at::ScalarType dtype) {
  const std::string torch_dtype = dtype == at::kBFloat16 ? "bfloat16" : dtype == at::kHalf ? "float16" : "float32";
  if (!o.is_llama()) {
    return {{"architectures", {"GPT2LMHeadModel"}}, {"model_type", "gpt2"}, {"vocab_size", o.vocab_size},
            {"n_positions", o.block_size}, {"n_ctx", o.block_size}, {"n_embd", o.n_embd}, {"n_layer", o.n_layer},
            {"n_head", o.n_head}, {"n_inner", nullptr}, {"activation_function", "gelu_new"},
            {"layer_norm_epsilon", o.norm_eps}, {"resid_pdrop", o.dropout}, {"embd_pdrop", o.dropout},
            {"attn_pdrop", o.dropout}, {"initializer_range", 0.02}, {"scale_attn_weights", true},
            {"tie_word_embeddings", true}, {"use_cache", true}, {"torch_dtype", torch_dtype}};
  }
  return {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"vocab_size", o.vocab_size},
          {"hidden_size", o.n_embd}, {"intermediate_size", o.mlp_hidden()}, {"num_hidden_layers", o.n_layer},
          {"num_attention_heads", o.n_head}, {"num_key_value_heads", o.kv_heads()}, {"head_dim", o.head_dim()},
          {"max_position_embeddings", o.block_size}, {"rms_norm_eps", o.norm_eps}, {"rope_theta", o.rope_theta},
          {"rope_scaling", nullptr}, {"hidden_act", "silu"}, {"attention_bias", false}, {"mlp_bias", false},
          {"attention_dropout", o.dropout}, {"initializer_range", 0.02}, {"pretraining_tp", 1},
          {"tie_word_embeddings", o.tied()}, {"use_cache", true}, {"torch_dtype", torch_dtype}};
}

namespace hf_layout_impl {

// A key of config.json, checked: UserError naming the file and the key otherwise.
class ConfigReader {
 public:
  ConfigReader(const json& c, std::string where) : c_(c), where_(std::move(where)) {}
  int64_t integer(const char* key) const {
    const json& v = at(key);
    if (!v.is_number_integer() || v.get<int64_t>() < 1) fail(key, "a whole number of 1 or more", v);
    return v.get<int64_t>();
  }
  double number(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    const json& v = at(key);
    if (!v.is_number() || v.get<double>() <= 0) fail(key, "a positive number", v);
    return v.get<double>();
  }
  bool flag(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!at(key).is_boolean()) fail(key, "true or false", at(key));
    return at(key).get<bool>();
  }
  std::string text(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    if (!at(key).is_string()) fail(key, "a string", at(key));
    return at(key).get<std::string>();
  }
  bool has(const char* key) const { return c_.contains(key) && !c_[key].is_null(); }
  const json& at(const char* key) const {
    if (!c_.contains(key)) throw UserError(where_ + ": no \"" + key + "\" in it; a config.json of transformers has one");
    return c_[key];
  }
  [[noreturn]] void fail(const char* key, const char* expected, const json& v) const {
    throw UserError(where_ + ": \"" + key + "\" must be " + expected + ", got " + v.dump());
  }
  [[noreturn]] void unsupported(const std::string& what) const {
    throw UserError(where_ + ": " + what + "; this decoder builds GPT-2 and Llama 2/3 as transformers describes them");
  }
  const std::string& where() const { return where_; }

 private:
  const json& c_;
  std::string where_;
};

DecoderOptions gpt2_from(const ConfigReader& r) {
  DecoderOptions o = DecoderOptions::gpt2(r.integer("vocab_size"), r.has("n_positions") ? r.integer("n_positions") : r.integer("n_ctx"),
                                          r.integer("n_layer"), r.integer("n_head"), r.integer("n_embd"), 0.0);
  o.norm_eps = r.number("layer_norm_epsilon", 1e-5);
  if (r.has("n_inner") && r.integer("n_inner") != 4 * o.n_embd) r.unsupported("n_inner is not 4 x n_embd");
  const std::string act = r.text("activation_function", "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh") r.unsupported("activation_function \"" + act + "\" is not GELU's tanh form (gelu_new)");
  if (r.flag("scale_attn_by_inverse_layer_idx", false)) r.unsupported("scale_attn_by_inverse_layer_idx is true");
  if (!r.flag("scale_attn_weights", true)) r.unsupported("scale_attn_weights is false");
  if (!r.flag("tie_word_embeddings", true)) r.unsupported("GPT-2 with an untied head (tie_word_embeddings false)");
  return o;
}

DecoderOptions llama_from(const ConfigReader& r) {
  const int64_t heads = r.integer("num_attention_heads");
  DecoderOptions o = DecoderOptions::llama(r.integer("vocab_size"), r.integer("max_position_embeddings"),
                                           r.integer("num_hidden_layers"), heads,
                                           r.has("num_key_value_heads") ? r.integer("num_key_value_heads") : heads,
                                           r.integer("hidden_size"));
  o.norm_eps = r.number("rms_norm_eps", 1e-6);  // LlamaConfig's defaults
  o.rope_theta = r.number("rope_theta", 10000.0);
  o.tie_embeddings = r.flag("tie_word_embeddings", false);
  if (r.text("hidden_act", "silu") != "silu") r.unsupported("hidden_act \"" + r.text("hidden_act", "") + "\" is not silu");
  if (r.flag("attention_bias", false) || r.flag("mlp_bias", false)) r.unsupported("attention_bias or mlp_bias is true");
  if (r.has("rope_scaling")) r.unsupported("rope_scaling is set (Llama 3.1's long-context rotary scaling is not built)");
  if (r.has("head_dim") && r.integer("head_dim") != o.head_dim()) r.unsupported("head_dim is not hidden_size / num_attention_heads");
  // intermediate_size as our rule's result: a multiple of itself, scaled down first if 2/3 of
  // 4 x hidden_size exceeds it.
  const int64_t f = r.integer("intermediate_size"), base = 2 * (4 * o.n_embd) / 3;
  o.multiple_of = f;
  o.ffn_dim_multiplier = base > f ? (static_cast<double>(f) + 0.5) / static_cast<double>(base) : 0.0;
  TORCH_INTERNAL_ASSERT(o.mlp_hidden() == f, "intermediate_size ", f, " came out as ", o.mlp_hidden());
  return o;
}

}  // namespace hf_layout_impl

DecoderOptions decoder_options_from_hf(const nlohmann::json& config, const std::string& where) {
  if (!config.is_object()) throw UserError(where + ": not a JSON object; give transformers' config.json");
  const hf_layout_impl::ConfigReader r(config, where);
  const std::string type = r.text("model_type", "");
  DecoderOptions o;
  if (type == "gpt2") {
    o = hf_layout_impl::gpt2_from(r);
  } else if (type == "llama") {
    o = hf_layout_impl::llama_from(r);
  } else {
    throw UserError(where + ": model_type \"" + type + "\": the importer reads \"gpt2\" (GPT2LMHeadModel) and \"llama\" "
                    "(LlamaForCausalLM)");
  }
  const std::string problem = o.problem();
  if (!problem.empty()) throw UserError(where + ": describes a shape this decoder cannot build: " + problem);
  return o;
}

std::string model_keys_differing(const DecoderOptions& have, const DecoderOptions& wanted) {
  std::ostringstream out;
  auto key = [&](const char* name, const auto& value) {
    out << (out.tellp() > 0 ? ", " : "") << "model." << name << " = " << value;
  };
  if (have.family != wanted.family) key("name", std::string("\"") + choice_name(wanted.family) + "\"");
  if (have.vocab_size != wanted.vocab_size) key("vocab_size", wanted.vocab_size);
  if (!wanted.is_llama() && have.block_size != wanted.block_size) key("block_size", wanted.block_size);
  if (have.n_layer != wanted.n_layer) key("n_layer", wanted.n_layer);
  if (have.n_head != wanted.n_head) key("n_head", wanted.n_head);
  if (have.kv_heads() != wanted.kv_heads()) key("n_kv_heads", wanted.kv_heads());
  if (have.n_embd != wanted.n_embd) key("n_embd", wanted.n_embd);
  if (wanted.is_llama() && have.mlp_hidden() != wanted.mlp_hidden()) {  // GPT-2's is 4 x n_embd
    key("multiple_of", wanted.multiple_of);
    key("ffn_dim_multiplier", wanted.ffn_dim_multiplier);
  }
  if (wanted.is_llama() && have.tied() != wanted.tied()) key("tie_embeddings", wanted.tied() ? "true" : "false");
  if (wanted.is_llama() && have.rope_theta != wanted.rope_theta) key("rope_theta", wanted.rope_theta);
  if (std::abs(have.norm_eps - wanted.norm_eps) > 1e-12) key("norm_eps", wanted.norm_eps);
  return out.str();
}

}  // namespace ht

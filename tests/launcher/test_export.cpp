// Weights that leave the trainer and come back: the safetensors reader and writer, the Hugging
// Face layouts (names and shapes against published checkpoints at their real shapes, GPT-2's
// Conv1D transposes, Llama's rotary permutation), export -> import bit for bit, and the files and
// checkpoints that must be refused. The logits against an independent Python implementation are
// tests/python/hf_reference.py's (ctest: hf_reference).
#include "launcher/export/hf_checkpoint.h"
#include "launcher/export/hf_layout.h"
#include "launcher/export/safetensors.h"
#include "base/user_error.h"
#include "models/decoder.h"
#include "runtime/interpreter.h"
#include "tests/support/temp_dir.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>

namespace ht::test {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using nlohmann::json;

// Every parameter random, norms and biases included, so that a wrong mapping shows.
std::shared_ptr<Decoder> random_decoder(const DecoderOptions& o, uint64_t seed) {
  at::manual_seed(static_cast<int64_t>(seed));
  auto m = std::make_shared<Decoder>(o);
  at::NoGradGuard no_grad;
  for (at::Tensor& p : m->parameters()) p.normal_(0.0, 0.3);
  return m;
}

DecoderOptions small_gpt2() { return DecoderOptions::gpt2(37, 16, 2, 4, 32, 0.0); }
DecoderOptions small_llama(bool tied) {
  DecoderOptions o = DecoderOptions::llama(37, 16, 2, 4, 2, 32);  // grouped-query: 2 key/value heads
  o.multiple_of = 16;
  o.tie_embeddings = tied;
  o.rope_theta = 500000;
  return o;
}

std::map<std::string, at::Tensor> parameters_of(const Model& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : m.named_parameters()) out[p.key()] = p.value();
  return out;
}

TEST(Export, ARoundTripThroughSafetensorsGivesBitIdenticalParameters) {
  for (const DecoderOptions& o : {small_gpt2(), small_llama(false), small_llama(true)}) {
    TempDir dir;
    const auto original = random_decoder(o, 1);
    export_hf(*original, o, dir.path("hf"), at::kFloat);
    const auto copy = random_decoder(o, 2);
    import_hf(*copy, o, HfCheckpoint::open(dir.path("hf")), "the test");
    const auto a = parameters_of(*original), b = parameters_of(*copy);
    ASSERT_EQ(a.size(), b.size());
    for (const auto& [name, value] : a) EXPECT_TRUE(value.equal(b.at(name))) << choice_name(o.family) << " " << name;
  }
}

TEST(Export, TheConfigJsonDescribesTheShapeItWasWrittenFrom) {
  for (const DecoderOptions& o : {small_gpt2(), small_llama(false), small_llama(true)}) {
    const DecoderOptions back = decoder_options_from_hf(hf_config(o, at::kFloat), "config.json");
    EXPECT_EQ(model_keys_differing(o, back), "") << choice_name(o.family);
    EXPECT_EQ(back.mlp_hidden(), o.mlp_hidden());
    EXPECT_EQ(back.parameter_count(), o.parameter_count());
  }
}

// {name: shape} of a fixture entry, its layer templates expanded.
std::map<std::string, std::vector<int64_t>> published(const json& entry) {
  std::map<std::string, std::vector<int64_t>> out;
  for (const auto& [name, shape] : entry["tensors"].items()) out[name] = shape.get<std::vector<int64_t>>();
  for (int64_t i = 0; i < entry["layers"].get<int64_t>(); ++i) {
    for (const auto& [name, shape] : entry["layer_tensors"].items()) {
      std::string n = name;
      n.replace(n.find("{i}"), 3, std::to_string(i));
      out[n] = shape.get<std::vector<int64_t>>();
    }
  }
  return out;
}

json fixture() {
  std::ifstream in(std::string(HT_SOURCE_DIR) + "/tests/fixtures/hf_layouts.json");
  return json::parse(in);
}

// The layout at a published model's real shape (from its config.json) against the published
// names and shapes; every tensor of the file is ours or a buffer the importer skips.
void expect_published_layout(const json& entry, int64_t* parameters) {
  const DecoderOptions o = decoder_options_from_hf(entry["config"], "fixture");
  std::map<std::string, std::vector<int64_t>> theirs;
  for (const auto& [name, shape] : published(entry)) {
    if (hf_ignored(hf_canonical_name(name, o), o)) continue;
    theirs[hf_canonical_name(name, o)] = shape;
  }
  std::map<std::string, std::vector<int64_t>> ours;
  *parameters = 0;
  for (const HfTensor& t : hf_tensors(o)) {
    ours[t.name] = t.shape;
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    *parameters += n;
  }
  EXPECT_EQ(ours, theirs);
  EXPECT_EQ(*parameters, o.parameter_count());
}

TEST(Export, NamesAndShapesAreThoseOfHuggingFacesPublishedGpt2) {
  const json entry = fixture()["gpt2"];
  int64_t parameters = 0;
  expect_published_layout(entry, &parameters);
  EXPECT_EQ(parameters, entry["parameters"].get<int64_t>());
  // The published file names tensors without "transformer." and holds the causal-mask buffers.
  const DecoderOptions o = decoder_options_from_hf(entry["config"], "fixture");
  EXPECT_EQ(hf_canonical_name("h.3.attn.c_attn.weight", o), "transformer.h.3.attn.c_attn.weight");
  EXPECT_TRUE(hf_ignored("transformer.h.3.attn.bias", o));
  EXPECT_FALSE(hf_ignored("transformer.h.3.attn.c_attn.bias", o));
}

TEST(Export, NamesAndShapesAreThoseOfMetasPublishedLlama3_8B) {
  const json entry = fixture()["llama3_8b"];
  int64_t parameters = 0;
  expect_published_layout(entry, &parameters);
  EXPECT_EQ(2 * parameters, entry["total_size"].get<int64_t>()) << "bfloat16 bytes of the published index";
  EXPECT_EQ(decoder_options_from_hf(entry["config"], "fixture").mlp_hidden(), 14336);
}

// The tensors a file holds, read back.
std::map<std::string, at::Tensor> read_all(const std::string& path) {
  const SafetensorsFile file(path);
  std::map<std::string, at::Tensor> out;
  for (const SafetensorsEntry& e : file.entries()) out[e.name] = file.read(e);
  return out;
}

TEST(Export, Gpt2sConv1DWeightsAreStoredInputByOutput) {
  TempDir dir;
  const DecoderOptions o = small_gpt2();
  const auto model = random_decoder(o, 3);
  export_hf(*model, o, dir.path("hf"), at::kFloat);
  const auto t = read_all(dir.path("hf/model.safetensors"));
  const auto p = parameters_of(*model);
  EXPECT_TRUE(t.at("transformer.h.1.attn.c_attn.weight").equal(p.at("h1.attn.wqkv.weight").t())) << "[q | k | v], transposed";
  EXPECT_TRUE(t.at("transformer.h.1.attn.c_attn.bias").equal(p.at("h1.attn.wqkv.bias")));
  EXPECT_TRUE(t.at("transformer.h.0.mlp.c_fc.weight").equal(p.at("h0.mlp.fc.weight").t()));
  EXPECT_TRUE(t.at("transformer.h.0.mlp.c_proj.weight").equal(p.at("h0.mlp.proj.weight").t()));
  EXPECT_EQ(t.count("lm_head.weight"), 0u) << "tied";
  const SafetensorsFile file(dir.path("hf/model.safetensors"));
  EXPECT_EQ(file.metadata().at("format"), "pt") << "transformers refuses a file without it";
}

// Hugging Face's rotary embedding (modeling_llama.py: rotate_half, cos/sin of cat(freqs, freqs)).
at::Tensor rotate_half_rope(const at::Tensor& x, double theta) {  // x (B, T, H, hd)
  const int64_t t = x.size(1), hd = x.size(3);
  const at::Tensor inv_freq = 1.0 / at::pow(theta, at::arange(0, hd, 2, at::kDouble) / static_cast<double>(hd));
  const at::Tensor freqs = at::outer(at::arange(t, at::kDouble), inv_freq);
  const at::Tensor emb = at::cat({freqs, freqs}, -1).unsqueeze(1);  // (T, 1, hd)
  const at::Tensor xd = x.to(at::kDouble);
  const at::Tensor rotated = at::cat({-xd.narrow(-1, hd / 2, hd / 2), xd.narrow(-1, 0, hd / 2)}, -1);
  return xd * emb.cos() + rotated * emb.sin();
}

TEST(Export, LlamasQueryAndKeyPermutationTurnsInterleavedRotaryIntoRotateHalf) {
  TempDir dir;
  const DecoderOptions o = small_llama(false);
  const auto model = random_decoder(o, 4);
  export_hf(*model, o, dir.path("hf"), at::kFloat);
  const auto t = read_all(dir.path("hf/model.safetensors"));
  const auto p = parameters_of(*model);
  const int64_t hd = o.head_dim(), half = hd / 2;
  // Row 2i + j of a head moves to j * hd/2 + i (convert_llama_weights_to_hf.py's permute).
  const int64_t q_rows = o.n_head * hd, kv_rows = o.kv_heads() * hd;
  const at::Tensor wqkv = p.at("h0.attn.wqkv.weight"), wq = wqkv.narrow(0, 0, q_rows), wk = wqkv.narrow(0, q_rows, kv_rows);
  const at::Tensor k_proj = t.at("model.layers.0.self_attn.k_proj.weight");
  for (int64_t head = 0; head < o.kv_heads(); ++head) {
    for (int64_t i = 0; i < half; ++i) {
      for (int64_t j = 0; j < 2; ++j) EXPECT_TRUE(k_proj[head * hd + j * half + i].equal(wk[head * hd + 2 * i + j]));
    }
  }
  EXPECT_TRUE(t.at("model.layers.0.self_attn.v_proj.weight").equal(wqkv.narrow(0, q_rows + kv_rows, kv_rows)));
  const at::Tensor w13 = p.at("h0.mlp.w13.weight");
  const int64_t f = o.mlp_hidden();
  EXPECT_TRUE(t.at("model.layers.0.mlp.gate_proj.weight").equal(w13.narrow(0, 0, f))) << "Meta's w1";
  EXPECT_TRUE(t.at("model.layers.0.mlp.up_proj.weight").equal(w13.narrow(0, f, f))) << "Meta's w3";
  // Attention scores are the same computed either way: ours (interleaved pairs) on our rows,
  // Hugging Face's (halves) on the exported rows.
  const at::Tensor x = at::randn({1, 7, o.n_embd}, at::kDouble);
  auto heads = [&](const at::Tensor& w, int64_t n) { return at::matmul(x, w.to(at::kDouble).t()).view({1, 7, n, hd}); };
  Interpreter interp;
  auto ours = [&](const at::Tensor& w, int64_t n) { return rope(interp.input(heads(w, n)), o.rope_theta).value(); };
  const at::Tensor q_ours = ours(wq, o.n_head), k_ours = ours(wk, o.kv_heads());
  const at::Tensor q_hf = rotate_half_rope(heads(t.at("model.layers.0.self_attn.q_proj.weight"), o.n_head), o.rope_theta);
  const at::Tensor k_hf = rotate_half_rope(heads(k_proj, o.kv_heads()), o.rope_theta);
  for (int64_t h = 0; h < o.n_head; ++h) {
    const int64_t g = h / (o.n_head / o.kv_heads());
    const at::Tensor s_ours = at::matmul(q_ours.select(2, h), k_ours.select(2, g).transpose(-1, -2));
    const at::Tensor s_hf = at::matmul(q_hf.select(2, h), k_hf.select(2, g).transpose(-1, -2));
    EXPECT_TRUE(at::allclose(s_ours, s_hf, 1e-9, 1e-9)) << "head " << h << ": " << (s_ours - s_hf).abs().max().item<double>();
  }
}

TEST(Export, Bfloat16HalvesTheBytesAndReadsBackRounded) {
  TempDir dir;
  const DecoderOptions o = small_llama(true);
  const auto model = random_decoder(o, 5);
  export_hf(*model, o, dir.path("bf16"), at::kBFloat16);
  const SafetensorsFile file(dir.path("bf16/model.safetensors"));
  EXPECT_EQ(file.find("model.embed_tokens.weight")->dtype_name, "BF16");
  EXPECT_TRUE(file.read("model.embed_tokens.weight").equal(parameters_of(*model).at("embed.wte.weight").to(at::kBFloat16)));
  EXPECT_EQ(json::parse(read_file(dir.path("bf16/config.json")))["torch_dtype"], "bfloat16");
}

TEST(Export, AShardedBfloat16CheckpointLoadsThroughItsIndex) {
  // As the Hub publishes large models: model-0000N-of-0000M.safetensors and an index naming them.
  TempDir dir;
  const DecoderOptions o = small_llama(false);
  const auto model = random_decoder(o, 6);
  export_hf(*model, o, dir.path("whole"), at::kFloat);
  const SafetensorsFile whole(dir.path("whole/model.safetensors"));
  std::vector<SafetensorsOutput> shards[2];
  json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", json::object()}};
  for (size_t i = 0; i < whole.entries().size(); ++i) {
    const SafetensorsEntry& e = whole.entries()[i];
    const int shard = i < whole.entries().size() / 2 ? 0 : 1;
    shards[shard].push_back({e.name, e.shape, [&whole, e] { return whole.read(e); }});
    index["weight_map"][e.name] = "model-0000" + std::to_string(shard + 1) + "-of-00002.safetensors";
  }
  std::filesystem::create_directories(dir.path("sharded"));
  for (int shard = 0; shard < 2; ++shard) {
    write_safetensors(dir.path("sharded/model-0000" + std::to_string(shard + 1) + "-of-00002.safetensors"), shards[shard],
                      at::kBFloat16, {{"format", "pt"}});
  }
  dir.write("sharded/model.safetensors.index.json", index.dump());
  std::filesystem::copy_file(dir.path("whole/config.json"), dir.path("sharded/config.json"));
  const auto copy = random_decoder(o, 7);
  import_hf(*copy, o, HfCheckpoint::open(dir.path("sharded")), "the test");
  const auto a = parameters_of(*model), b = parameters_of(*copy);
  for (const auto& [name, value] : a) {
    EXPECT_TRUE(value.to(at::kBFloat16).to(at::kFloat).equal(b.at(name))) << name << ": bfloat16's rounding, nothing else";
  }
}

}  // namespace
}  // namespace ht::test

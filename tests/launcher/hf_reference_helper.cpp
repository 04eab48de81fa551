// The C++ half of the Hugging Face reference check (tests/python/hf_reference.py, the other half,
// runs it): our decoder's logits on given tokens, for Python to compare with its own
// implementation of transformers' GPT-2 and Llama.
//   hf_reference_helper export CASE DIR   a random decoder of CASE (gpt2, llama_gqa,
//       llama_gqa_tied) exported to DIR (model.safetensors, config.json), and DIR/expected.safetensors
//       with "tokens" (2, T) and our "logits" (2, T, V) on them;
//   hf_reference_helper import DIR        the checkpoint Python wrote in DIR (its config.json
//       giving the shape) loaded into our decoder, our "logits" on DIR/inputs.safetensors's
//       "tokens" written to DIR/ours.safetensors.
#include "launcher/export/hf_checkpoint.h"
#include "launcher/export/hf_layout.h"
#include "launcher/export/safetensors.h"
#include "base/user_error.h"
#include "models/decoder.h"
#include "runtime/interpreter.h"

#include <cstdio>
#include <string>

namespace {

using namespace ht;

DecoderOptions case_options(const std::string& name) {
  if (name == "gpt2") return DecoderOptions::gpt2(53, 24, 2, 4, 32, 0.0);
  DecoderOptions o = DecoderOptions::llama(53, 24, 2, 4, 2, 32);  // 2 key/value heads for 4 query heads
  o.multiple_of = 16;
  o.rope_theta = 500000;
  o.norm_eps = 1e-6;
  o.tie_embeddings = name == "llama_gqa_tied";
  TORCH_CHECK(name == "llama_gqa" || name == "llama_gqa_tied", "unknown case ", name);
  return o;
}

at::Tensor logits_of(Decoder& model, const at::Tensor& tokens) {
  model.eval();
  Interpreter interp;
  NoGradGuard no_grad(interp);
  return model.logits(model.forward(interp.input(tokens))).value().clone();
}

void write(const std::string& path, const std::map<std::string, at::Tensor>& tensors, at::ScalarType dtype) {
  std::vector<SafetensorsOutput> out;
  for (const auto& [name, t] : tensors) out.push_back({name, t.sizes().vec(), [t] { return t; }});
  write_safetensors(path, out, dtype, {{"format", "pt"}});
}

int export_case(const std::string& name, const std::string& dir) {
  const DecoderOptions o = case_options(name);
  at::manual_seed(42);
  Decoder model(o);
  {
    at::NoGradGuard no_grad;  // every parameter random, norms and biases too
    for (at::Tensor& p : model.parameters()) p.normal_(0.0, 0.2);
    for (const auto& p : model.named_parameters()) {
      if (p.key().find("norm.weight") != std::string::npos) p.value().add_(1.0);
    }
  }
  export_hf(model, o, dir, at::kFloat);
  const at::Tensor tokens = at::randint(o.vocab_size, {2, o.block_size}, at::kLong);
  const at::Tensor logits = logits_of(model, tokens);
  write(dir + "/expected_tokens.safetensors", {{"tokens", tokens}}, at::kLong);
  write(dir + "/expected.safetensors", {{"logits", logits}}, at::kFloat);
  return 0;
}

int import_case(const std::string& dir) {
  const HfCheckpoint source = HfCheckpoint::open(dir);
  TORCH_CHECK(source.options().has_value(), dir, " has no config.json");
  const DecoderOptions o = *source.options();
  Decoder model(o);
  import_hf(model, o, source, "the checkpoint");
  const at::Tensor tokens = SafetensorsFile(dir + "/inputs.safetensors").read("tokens");
  write(dir + "/ours.safetensors", {{"logits", logits_of(model, tokens)}}, at::kFloat);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "export" && argc == 4) return export_case(argv[2], argv[3]);
    if (mode == "import" && argc == 3) return import_case(argv[2]);
    std::fprintf(stderr, "usage: hf_reference_helper export gpt2|llama_gqa|llama_gqa_tied DIR | import DIR\n");
    return 2;
  } catch (const ht::UserError& e) {
    std::fprintf(stderr, "hf_reference_helper: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hf_reference_helper: internal error: %s\n", e.what());
    return 1;
  }
}

#pragma once
// A decoder's weights as a Hugging Face checkpoint, out and in: `hybrid_train export` writes
// model.safetensors and config.json that transformers' GPT2LMHeadModel / LlamaForCausalLM load
// as they are; model.init_from reads such a checkpoint (ours, or a published one: gpt2,
// TinyLlama, Llama 3) into the decoder [model] builds, before training. The names and the
// layout changes are hf_layout.h's; this file moves the bytes and checks that they fit.

#include "launcher/config/config.h"
#include "launcher/export/safetensors.h"
#include "models/decoder_options.h"
#include "models/model.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ht {

// A Hugging Face checkpoint on disk: a folder with model.safetensors (or the shards that
// model.safetensors.index.json lists) and config.json, or one .safetensors file.
class HfCheckpoint {
 public:
  // UserError naming `path` when it is neither, or a file in it is not valid.
  static HfCheckpoint open(const std::string& path);

  const std::string& path() const { return path_; }
  // The shape config.json describes, when there is one beside the weights.
  const std::optional<DecoderOptions>& options() const { return options_; }
  // The file and entry of a tensor, by its name in the file; {nullptr, nullptr} if absent.
  std::pair<const SafetensorsFile*, const SafetensorsEntry*> find(const std::string& name) const;
  // Every tensor's name, in file order.
  std::vector<std::string> names() const;

 private:
  std::string path_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::optional<DecoderOptions> options_;
};

// Writes DIR/model.safetensors (every tensor in `dtype`) and DIR/config.json, each atomically,
// from `model`, a decoder of shape `options`. Returns the folder's files' total bytes.
int64_t export_hf(const Model& model, const DecoderOptions& options, const std::string& dir, at::ScalarType dtype);

// Copies every parameter of `model` (a decoder of shape `options`) from `source`. Names, shapes
// and dtypes are all checked first, so a refused checkpoint changes nothing. UserError naming
// the file, the tensor, both shapes and the [model] key to change; `key` is the setting that
// named the checkpoint (e.g. "model.init_from"), for the message.
void import_hf(Model& model, const DecoderOptions& options, const HfCheckpoint& source, const std::string& key);

// model.init_from, when set: the configured decoder's parameters from that checkpoint. Returns
// warnings (settings that differ from its config.json without changing a shape: rope_theta,
// norm_eps).
std::vector<std::string> initialize_from_hf(Model& model, const Config& config, const DecoderOptions& options);

}  // namespace ht

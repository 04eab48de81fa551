#include "launcher/export/hf_checkpoint.h"

#include "launcher/export/hf_layout.h"
#include "training/run_output.h"
#include "base/user_error.h"
#include "models/decoder.h"
#include "models/decoder_split.h"
#include "alloc/cpu_device_allocator.h"
#include "base/remove_tree.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

namespace ht {
namespace hf_checkpoint_impl {

namespace fs = std::filesystem;
using nlohmann::json;

json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw UserError(path.string() + ": cannot read it");
  try {
    return json::parse(in);
  } catch (const json::parse_error& e) {
    throw UserError(path.string() + ": not valid JSON (" + e.what() + ")");
  }
}

// The shard files a model.safetensors.index.json names, each once, in order.
std::vector<std::string> shards_of(const fs::path& index) {
  const json j = read_json(index);
  if (!j.contains("weight_map") || !j["weight_map"].is_object()) {
    throw UserError(index.string() + ": no \"weight_map\" object in it; is it a model.safetensors.index.json?");
  }
  std::set<std::string> files;
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string()) throw UserError(index.string() + ": weight_map." + name + " must name a file");
    files.insert((index.parent_path() / file.get<std::string>()).string());
  }
  return {files.begin(), files.end()};
}

std::string shape_text(at::IntArrayRef shape) { return c10::str(shape); }

// What to change when `name` does not fit, without a config.json to read the answer from.
std::string key_hint(const std::string& name) {
  auto has = [&](const char* part) { return name.find(part) != std::string::npos; };
  if (has("wte") || has("embed_tokens") || has("lm_head")) return "model.vocab_size (its rows) or model.n_embd (its columns)";
  if (has("wpe")) return "model.block_size (its rows) or model.n_embd";
  if (has("k_proj") || has("v_proj")) return "model.n_kv_heads or model.n_embd";
  if (has("gate_proj") || has("up_proj") || has("down_proj")) return "model.ffn_dim_multiplier and model.multiple_of, or model.n_embd";
  if (has("mlp")) return "model.n_embd";
  return "model.n_embd or model.n_head";
}

// The message's ending: what to set, from config.json when the checkpoint has one, else `hint`.
std::string fix_for(const HfCheckpoint& source, const DecoderOptions& o, const std::string& hint, const std::string& key) {
  if (source.options()) {
    const std::string keys = model_keys_differing(o, *source.options());
    if (!keys.empty()) return "; its config.json describes " + keys + ": set those in [model] (or change " + key + ")";
  }
  return "; " + hint + ", or change " + key;
}

bool is_layer_tensor(const std::string& name) {
  return name.find("layers.") != std::string::npos || name.rfind("h.", 0) == 0 || name.rfind("transformer.h.", 0) == 0;
}

// Every tensor of the layout in the file, of its shape and a floating dtype; nothing else there
// but what hf_ignored allows. The file's name of each layout tensor.
std::map<std::string, std::string> check_fits(const HfCheckpoint& source, const DecoderOptions& o,
                                              const std::vector<HfTensor>& layout, const std::string& key) {
  std::map<std::string, std::string> file_name;  // layout name -> name in the file
  for (const std::string& name : source.names()) file_name[hf_canonical_name(name, o)] = name;
  std::set<std::string> used;
  for (const HfTensor& t : layout) {
    const auto it = file_name.find(t.name);
    if (it == file_name.end()) {
      if (t.name == "lm_head.weight") {
        throw UserError(source.path() + ": no lm_head.weight: the checkpoint ties its output head to the embedding; "
                        "set model.tie_embeddings = true (or change " + key + ")");
      }
      const std::string hint = is_layer_tensor(t.name) ? "set model.n_layer to the checkpoint's layer count"
                                                       : "is it a checkpoint of this model.name?";
      throw UserError(source.path() + ": no tensor " + t.name + ", which the configured model needs" +
                      fix_for(source, o, hint, key));
    }
    used.insert(it->second);
    const auto [file, entry] = source.find(it->second);
    if (entry->shape != t.shape) {
      throw UserError(source.path() + ": " + it->second + " is " + shape_text(entry->shape) + " there but " +
                      shape_text(t.shape) + " in the configured model" +
                      fix_for(source, o, "change " + key_hint(t.name) + " to the checkpoint's", key));
    }
    if (!at::isFloatingType(entry->dtype)) {
      throw UserError(source.path() + ": " + it->second + " is " + entry->dtype_name + "; weights must be F32, BF16, F16 or F64");
    }
  }
  for (const std::string& name : source.names()) {
    if (used.count(name) == 0 && !hf_ignored(hf_canonical_name(name, o), o)) {
      const std::string hint = is_layer_tensor(name) ? "set model.n_layer to the checkpoint's layer count"
                                                     : "is it a checkpoint of this model.name?";
      throw UserError(source.path() + ": it holds " + name + ", which the configured model has no place for" +
                      fix_for(source, o, hint, key));
    }
  }
  return file_name;
}

// A tied model takes the embedding as its head: a checkpoint whose lm_head differs is untied.
void check_tied_head(const HfCheckpoint& source, const DecoderOptions& o, const std::string& embed_name,
                     const std::string& key) {
  if (!o.is_llama() || !o.tied()) return;
  const auto [head_file, head] = source.find("lm_head.weight");
  if (head == nullptr) return;
  const auto [embed_file, embed] = source.find(embed_name);
  if (head->shape == embed->shape && head_file->read(*head).equal(embed_file->read(*embed))) return;
  throw UserError(source.path() + ": its lm_head.weight differs from " + embed_name + ": the checkpoint's head is "
                  "untied; set model.tie_embeddings = false (or change " + key + ")");
}

// The layout names every parameter of the decoder and, between its tensors, each row of it once:
// a decoder whose parameters changed (names, fusions) fails here, not in a silently partial copy.
void check_layout_covers(const std::vector<HfTensor>& layout, const std::map<std::string, at::Tensor>& params) {
  std::map<std::string, int64_t> rows;
  for (const HfTensor& t : layout) {
    TORCH_INTERNAL_ASSERT(params.count(t.ours), "hf_layout: the decoder has no parameter ", t.ours, " for ", t.name);
    rows[t.ours] += t.rows < 0 ? params.at(t.ours).size(0) : t.rows;
  }
  for (const auto& [name, p] : params) {
    TORCH_INTERNAL_ASSERT(rows.count(name) && rows.at(name) == p.size(0), "hf_layout: parameter ", name, " ",
                          p.sizes(), " is not covered row for row by the Hugging Face layout");
  }
}

}  // namespace hf_checkpoint_impl

HfCheckpoint HfCheckpoint::open(const std::string& path) {
  namespace fs = std::filesystem;
  using namespace hf_checkpoint_impl;
  HfCheckpoint c;
  c.path_ = path;
  std::vector<std::string> files;
  if (fs::is_directory(path)) {
    const fs::path dir(path);
    if (fs::exists(dir / "model.safetensors")) {
      files.push_back((dir / "model.safetensors").string());
    } else if (fs::exists(dir / "model.safetensors.index.json")) {
      files = shards_of(dir / "model.safetensors.index.json");
    } else {
      throw UserError(path + ": no model.safetensors (nor model.safetensors.index.json) in this folder; give a folder "
                      "that hybrid_train export wrote or one from the Hugging Face Hub, or a .safetensors file");
    }
    if (fs::exists(dir / "config.json")) c.options_ = decoder_options_from_hf(read_json(dir / "config.json"), (dir / "config.json").string());
  } else if (fs::exists(path)) {
    files.push_back(path);
  } else {
    throw UserError(path + ": no such file or folder; give a folder with model.safetensors and config.json, or a "
                    ".safetensors file");
  }
  std::set<std::string> seen;
  for (const std::string& f : files) {
    c.files_.push_back(std::make_shared<SafetensorsFile>(f));
    for (const SafetensorsEntry& e : c.files_.back()->entries()) {
      if (!seen.insert(e.name).second) throw UserError(f + ": tensor " + e.name + " is in another shard too");
    }
  }
  return c;
}

std::pair<const SafetensorsFile*, const SafetensorsEntry*> HfCheckpoint::find(const std::string& name) const {
  for (const auto& f : files_) {
    if (const SafetensorsEntry* e = f->find(name)) return {f.get(), e};
  }
  return {nullptr, nullptr};
}

std::vector<std::string> HfCheckpoint::names() const {
  std::vector<std::string> out;
  for (const auto& f : files_) {
    for (const SafetensorsEntry& e : f->entries()) out.push_back(e.name);
  }
  return out;
}

int64_t export_hf(const Model& model, const DecoderOptions& o, const std::string& dir, at::ScalarType dtype) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const bool existed = fs::exists(dir);
  fs::create_directories(dir, ec);
  if (ec) throw UserError(dir + ": cannot create the folder (" + ec.message() + ")");
  std::map<std::string, at::Tensor> params;
  for (const auto& p : model.named_parameters()) params[p.key()] = p.value();
  std::vector<SafetensorsOutput> outputs;
  const std::vector<HfTensor> layout = hf_tensors(o);
  hf_checkpoint_impl::check_layout_covers(layout, params);
  for (const HfTensor& t : layout) {
    outputs.push_back({t.name, t.shape, [t, &params]() {
                         HostAllocationScope host;  // the converted copy is host memory, not the budget's
                         return to_hf(t, params.at(t.ours).detach()).to(at::kCPU);
                       }});
  }
  const std::string weights = (fs::path(dir) / "model.safetensors").string();
  const std::string config = (fs::path(dir) / "config.json").string();
  try {
    write_safetensors(weights, outputs, dtype, {{"format", "pt"}});
    write_file_atomically(config, hf_config(o, dtype).dump(2) + "\n");
  } catch (const UserError&) {
    if (!existed) remove_tree(dir, ec);  // nothing half written: a folder this made goes too
    throw;
  }
  return static_cast<int64_t>(fs::file_size(weights) + fs::file_size(config));
}

void import_hf(Model& model, const DecoderOptions& o, const HfCheckpoint& source, const std::string& key) {
  using namespace hf_checkpoint_impl;
  if (source.options() && source.options()->family != o.family) {
    throw UserError(source.path() + ": its config.json describes a " + choice_name(source.options()->family) +
                    " model; set model.name = \"" + choice_name(source.options()->family) + "\" (or change " + key + ")");
  }
  const std::vector<HfTensor> layout = hf_tensors(o);
  const std::map<std::string, std::string> file_name = check_fits(source, o, layout, key);
  check_tied_head(source, o, file_name.at(layout.front().name), key);
  // A tensor-parallel rank's model holds its parts of the split parameters (models/decoder_split.h):
  // each is assembled whole on the host from the file's tensors, one at a time, and the rank keeps
  // its part.
  const auto* decoder = dynamic_cast<const Decoder*>(&model);
  const DecoderOptions split = decoder != nullptr ? decoder->options() : o;
  std::map<std::string, at::Tensor> params, wholes;  // wholes: split parameters, being assembled
  std::map<std::string, at::Tensor> shapes;          // every parameter's whole shape (meta tensors)
  for (auto& p : model.named_parameters()) {
    params[p.key()] = p.value();
    shapes[p.key()] = at::empty(whole_sizes_of(split, p.key(), p.value().sizes().vec()),
                                at::TensorOptions().device(at::kMeta).dtype(p.value().scalar_type()));
  }
  check_layout_covers(layout, shapes);
  std::map<std::string, int64_t> rows_left;
  at::NoGradGuard no_grad;
  for (const HfTensor& t : layout) {
    const auto [file, entry] = source.find(file_name.at(t.name));
    HostAllocationScope host;  // the file's copy and a whole being assembled are host memory, not the budget's
    const at::Tensor theirs = from_hf(t, file->read(*entry));
    const ParameterSplit part = decoder_parameter_split(split, t.ours);
    if (!part.split()) {
      const at::Tensor target = our_rows(t, params.at(t.ours));
      TORCH_INTERNAL_ASSERT(target.sizes() == theirs.sizes(), t.name, ": ", target.sizes(), " vs ", theirs.sizes());
      target.copy_(theirs);
      continue;
    }
    at::Tensor& whole = wholes[t.ours];
    if (!whole.defined()) {
      whole = at::empty(shapes.at(t.ours).sizes(), params.at(t.ours).options().device(at::kCPU));
      rows_left[t.ours] = whole.size(0);
    }
    const at::Tensor target = our_rows(t, whole);
    TORCH_INTERNAL_ASSERT(target.sizes() == theirs.sizes(), t.name, ": ", target.sizes(), " vs ", theirs.sizes());
    target.copy_(theirs);
    if ((rows_left[t.ours] -= target.size(0)) == 0) {  // whole: the rank's part of it, and the whole goes
      params.at(t.ours).copy_(part_of(whole, part));
      wholes.erase(t.ours);
    }
  }
  TORCH_INTERNAL_ASSERT(wholes.empty(), "import_hf: a split parameter was not covered by the layout");
}

std::vector<std::string> initialize_from_hf(Model& model, const Config& config, const DecoderOptions& o) {
  std::vector<std::string> warnings;
  const std::string& path = config.model.init_from;
  if (path.empty() || !is_decoder(config.model.name)) return warnings;
  const std::string key = "model.init_from = \"" + path + "\"";
  HfCheckpoint source;
  try {
    source = HfCheckpoint::open(path);
    import_hf(model, o, source, key);
  } catch (const UserError& e) {
    throw UserError(config.source + ": " + key + ": " + e.what());
  }
  if (source.options()) {
    const DecoderOptions& theirs = *source.options();
    if ((o.is_llama() && theirs.rope_theta != o.rope_theta) || std::abs(theirs.norm_eps - o.norm_eps) > 1e-12) {
      warnings.push_back(config.source + ": " + key + ": its config.json has " + model_keys_differing(o, theirs) +
                         "; the weights were trained with those, so set them in [model] unless retraining them is the point");
    }
  }
  return warnings;
}

}  // namespace ht

#include "launcher/export/run_weights.h"

#include "launcher/config/config_loader.h"
#include "launcher/model_factory.h"
#include "training/checkpoint.h"
#include "base/user_error.h"

#include <torch/serialize/input-archive.h>

#include <cstdio>
#include <filesystem>

namespace ht {
namespace run_weights_impl {

namespace fs = std::filesystem;

// The newest checkpoint that verifies: in checkpoint.dir when the run set one and it is there,
// else in RUN_DIR/checkpoints (the default, wherever the run folder has moved since).
std::string latest_checkpoint(const Config& c, const std::string& run_dir, const std::string& command) {
  std::vector<std::string> places;
  if (!c.checkpoint.dir.empty()) places.push_back(c.checkpoint.dir);
  places.push_back((fs::path(run_dir) / "checkpoints").string());
  for (const std::string& dir : places) {
    std::vector<std::string> warnings;
    const std::optional<std::string> found = resolve_resume("latest", dir, warnings);
    for (const std::string& w : warnings) std::fprintf(stderr, "hybrid_train: warning: %s\n", w.c_str());
    if (found) return *found;
  }
  throw UserError(run_dir + ": no checkpoint in " + places.back() + ", and " + command + " reads the run's latest "
                  "checkpoint; train with checkpoint.interval > 0 (the last step is saved too) or stop a run with "
                  "SIGTERM, which saves one");
}

// Rows of the token embedding in the checkpoint: the vocabulary the run trained with.
int64_t saved_vocabulary(const std::string& checkpoint) {
  if (SliceIndex::present(checkpoint)) {  // a sharded run's slices: the index has the shape
    const SliceIndex index(checkpoint);
    const SlicedTensor* wte = index.find("param", "embed.wte.weight");
    if (wte == nullptr || wte->sizes.empty()) {
      throw UserError(checkpoint + ": no embed.wte.weight in its slices, so it is not a decoder's checkpoint");
    }
    return wte->sizes[0];
  }
  torch::serialize::InputArchive archive;
  archive.load_from((fs::path(checkpoint) / "model.pt").string());
  at::Tensor wte;
  if (!archive.try_read("embed.wte.weight", wte)) {
    throw UserError(checkpoint + "/model.pt: no embed.wte.weight in it, so it is not a decoder's checkpoint");
  }
  return wte.size(0);
}

// The run's config is read here, on this machine, to rebuild its model: what only the training
// machine had (a GPU, a memory budget, fp16 on CUDA) is set to what any machine has, so that a
// GPU run's config loads on a CPU one.
std::vector<ConfigOverride> where_it_was_trained_does_not_matter() {
  std::vector<ConfigOverride> out;
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"training.device", "cpu"}, {"training.mixed_precision", "off"}, {"memory.policy", "none"},
           {"memory.budget", ""}, {"memory.optimizer_state", "device"}, {"parallel.strategy", "manual"},
           {"parallel.tensor_parallel", "1"}, {"parallel.sequence_parallel", "false"}}) {
    out.push_back({key, value, "(reading a run's model on this machine: " + key + " = " + value + ")"});
  }
  return out;
}

}  // namespace run_weights_impl

RunWeights load_run_weights(const std::string& run_dir, const std::string& command) {
  namespace fs = std::filesystem;
  const fs::path resolved = fs::path(run_dir) / "config.resolved.toml";
  if (!fs::is_regular_file(resolved)) {
    throw UserError(run_dir + ": no config.resolved.toml there, so no run to " + command + "; give a run's "
                    "job.output_dir, e.g. runs/gpt_tiny");
  }
  RunWeights w;
  w.config = load_config(resolved.string(), run_weights_impl::where_it_was_trained_does_not_matter()).config;
  if (!is_decoder(w.config.model.name)) {
    throw UserError(run_dir + ": model.name = \"" + choice_name(w.config.model.name) + "\": " + command +
                    " works on the decoders (model.name = \"gpt\" or \"llama\")");
  }
  w.checkpoint = run_weights_impl::latest_checkpoint(w.config, run_dir, command);
  w.options = decoder_options(w.config.model, run_weights_impl::saved_vocabulary(w.checkpoint));
  w.model = std::make_shared<Decoder>(w.options);
  CheckpointStore::load_model(w.checkpoint, *w.model);
  w.model->eval();
  return w;
}

}  // namespace ht

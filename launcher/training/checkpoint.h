#pragma once
// Checkpoints: model, optimizer state, the data position and the interpreter's seed counter
// (all the random state training draws from), the loss scaler and the step. Each is a folder step_<N>/ holding
// model.pt, optimizer.pt, trainer.pt and a MANIFEST of sizes and CRC-32s written last; it is
// built under a temporary name, fsynced and renamed, so a folder named step_<N> is complete.
// A damaged checkpoint (missing file, wrong size or checksum) is detected on resume.

#include "launcher/data/sampler.h"
#include "launcher/training/loss_scaler.h"
#include "models/model.h"

#include <torch/optim/optimizer.h>

#include <optional>
#include <string>
#include <vector>

namespace ht {

struct TrainerState {
  int64_t step = 0;  // optimizer steps done
  SamplerPosition sampler;
  uint64_t seed_counter = 0;
  std::optional<LossScalerState> loss_scaler;  // fp16 runs only
};

class CheckpointStore {
 public:
  CheckpointStore(std::string dir, int64_t keep) : dir_(std::move(dir)), keep_(keep) {}

  // Writes step_<N>/ atomically and deletes the oldest beyond `keep`. Returns its folder.
  std::string save(const Model& model, const torch::optim::Optimizer& optimizer, const TrainerState& state) const;
  // Checkpoint folders, newest first.
  std::vector<std::string> list() const;

  // "" if the folder is a complete, undamaged checkpoint; otherwise why not.
  static std::string verify(const std::string& folder);
  // Loads a verified checkpoint; throws UserError if it does not fit the model or optimizer.
  static TrainerState load(const std::string& folder, Model& model, torch::optim::Optimizer& optimizer);
  // Loads only the model's parameters and buffers (hybrid_train export and sample); UserError if
  // they do not fit the model.
  static void load_model(const std::string& folder, Model& model);

 private:
  std::string dir_;
  int64_t keep_;
};

// Resolves [checkpoint] resume: "latest" picks the newest checkpoint that verifies, warning about
// each damaged one it skips (nullopt if there is none); a folder must verify, or UserError.
std::optional<std::string> resolve_resume(const std::string& resume, const std::string& dir,
                                          std::vector<std::string>& warnings);

}  // namespace ht

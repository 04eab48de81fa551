#pragma once
// Checkpoints: model, optimizer state, the data position and the interpreter's seed counter
// (all the random state training draws from), the loss scaler and the step. Each is a folder
// step_<N>/ holding trainer.pt, the model and its optimizer state, and a MANIFEST of sizes and
// CRC-32s written last; it is built under a temporary name, fsynced and renamed, so a folder named
// step_<N> is complete. A damaged checkpoint (missing file, wrong size or checksum) is detected on
// resume. The model and state are either whole (model.pt, optimizer.pt: one writer) or slices
// (rank_<r>.slices and .index, every rank of a sharded run writing its own pieces:
// training/slice_files.h); every reader takes both.

#include "training/sampler.h"
#include "training/loss_scaler.h"
#include "training/slice_files.h"
#include "models/model.h"
#include "parallel/communicator.h"

#include <torch/optim/optimizer.h>

#include <array>
#include <functional>
#include <map>
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

// A whole checkpoint in host memory, before its files are written (CheckpointStore::take): host
// copies of the model's tensors and of the optimizer with its state, which training no longer
// changes. Writing serializes each file straight to the disk and lets its copies go.
struct WholeCheckpoint {
  TrainerState state;
  std::vector<std::pair<std::string, at::Tensor>> parameters, buffers;  // by name
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  int64_t bytes = 0;  // the copies' bytes, about the files'
};

// What one rank's writing of its files into a checkpoint's temporary folder came to.
struct RankFiles {
  std::string why;                  // "" where every file is written and fsynced
  std::array<uint64_t, 4> files{};  // a sliced checkpoint's: SliceFileWriter::finish's
};

class CheckpointStore {
 public:
  CheckpointStore(std::string dir, int64_t keep) : dir_(std::move(dir)), keep_(keep) {}
  const std::string& dir() const { return dir_; }

  // Writes step_<N>/ atomically and deletes the oldest beyond `keep`. Returns its folder. The
  // same in its three parts: take, write_unpublished, publish.
  std::string save(const Model& model, torch::optim::Optimizer& optimizer, const TrainerState& state) const;
  // The model and optimizer copied to host memory: what the checkpoint needs is known before the
  // disk is touched, and training may change the model while it is written.
  WholeCheckpoint take(const Model& model, torch::optim::Optimizer& optimizer, const TrainerState& state) const;
  // Writes its files into the step's temporary folder, fsynced, releasing the copies as it goes;
  // UserError (nothing kept, the previous checkpoint as it was) where the disk has no room or
  // refused. Any thread.
  void write_unpublished(WholeCheckpoint& checkpoint) const;
  // Renames the step's temporary folder into place and deletes the oldest beyond `keep`. Returns
  // the folder.
  std::string publish(int64_t step) const;

  // The same as slices, collective over `group` (every rank calls it): rank 0 makes the temporary
  // folder, every rank writes its two files through `write`, rank 0 writes trainer.pt and the
  // manifest and renames. UserError on every rank where one rank's disk refused (nothing kept).
  // Returns the folder. The same in its three parts: begin_sliced, each rank's SliceFileWriter into
  // the folder it returns, finish.
  std::string save_sliced(Communicator& group, const TrainerState& state, const std::string& optimizer,
                          const std::function<void(SliceFileWriter&)>& write) const;
  // Collective over `group`: rank 0 makes the step's temporary folder. Returns it; UserError on
  // every rank where it could not.
  std::string begin_sliced(Communicator& group, int64_t step) const;
  // Collective over `group`, once every rank wrote its files into the temporary folder (`mine`:
  // this rank's outcome): rank 0 publishes (a sliced checkpoint: trainer.pt and the MANIFEST
  // first; a whole one: rank 0 wrote all of it). UserError on every rank where one could not write
  // (nothing kept; `late`, if not empty, says what ran meanwhile). Returns the folder.
  std::string finish(Communicator& group, const TrainerState& state, const RankFiles& mine, bool sliced,
                     const std::string& late = "") const;
  // Checkpoint folders, newest first.
  std::vector<std::string> list() const;
  // "" where no checkpoint of `step` is there yet; else what saving it replaces, said before it is
  // replaced: a damaged one (resume = "latest" fell back past it), or one an earlier run wrote
  // past the step this run resumed from.
  std::string replacing(int64_t step) const;

  // "" if the folder is a complete, undamaged checkpoint; otherwise why not.
  static std::string verify(const std::string& folder);
  // Loads a verified checkpoint; throws UserError if it does not fit the model or optimizer.
  static TrainerState load(const std::string& folder, Model& model, torch::optim::Optimizer& optimizer);
  // Loads only the model's parameters and buffers (hybrid_train export and sample); UserError if
  // they do not fit the model.
  static void load_model(const std::string& folder, Model& model);
  // A checkpoint's parameters and buffers, whole, by name (either layout).
  static std::map<std::string, at::Tensor> model_tensors(const std::string& folder);
  static TrainerState load_trainer_state(const std::string& folder);

 private:
  void publish_sliced(const std::string& folder, const TrainerState& state,
                      const std::vector<std::vector<double>>& all) const;
  std::string temporary(int64_t step) const;
  // Where the previous checkpoint stands, for a message that says nothing of this one was kept.
  std::string previous_kept() const;
  std::string dir_;
  int64_t keep_;
};

// The optimizer state a sliced checkpoint holds for elements [offset, offset + like.numel()) of
// `name`'s memory order, as optimizer_state gives it (AdamW: step, exp_avg, exp_avg_sq; SGD:
// momentum), each laid out and allocated like `like` (a parameter, or a 1-D piece of one); empty
// where the parameter has none (never stepped). UserError without AdamW's step count.
std::vector<at::Tensor> read_sliced_state(const SliceIndex& index, const std::string& name, int64_t offset,
                                          const at::Tensor& like);
// The same, each kind's like.numel() elements given by `read("state0")` and `read("state1")`
// (a tensor-parallel rank's reader of its part).
std::vector<at::Tensor> read_sliced_state(const SliceIndex& index, const std::string& name, const at::Tensor& like,
                                          const std::function<at::Tensor(const char* kind)>& read);

// Resolves [checkpoint] resume: "latest" picks the newest checkpoint that verifies, warning about
// each damaged one it skips (nullopt if there is none); a folder must verify, or UserError.
std::optional<std::string> resolve_resume(const std::string& resume, const std::string& dir,
                                          std::vector<std::string>& warnings);

}  // namespace ht

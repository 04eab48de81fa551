#pragma once
// A rank's training state and its checkpoints, whatever layout holds it: the whole model on one
// rank (rank 0 writes model.pt and optimizer.pt), a pipeline stage's share (gathered to the first
// stage for the one model-wide layout), or less than the whole (sharded replicas, tensor-parallel
// parts, either with pipeline stages: every rank writes its slices, training/slice_files.h). Any
// layout resumes from any checkpoint that fits the model: each rank reads what it will hold.
// One part of the trainer (training/trainer_parts.h), made with the layout's mechanisms.

#include "parallel/parameter_shards.h"
#include "parallel/pipeline_stage.h"
#include "runtime/memory_hooks.h"
#include "training/checkpoint.h"
#include "training/optimizer_step.h"
#include "training/rank_groups.h"
#include "training/run_output.h"

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>

namespace ht {

class ModelState {
 public:
  struct Layout {
    std::shared_ptr<PipelineStage> stage;               // pipeline stages
    std::shared_ptr<ParameterShards> parameter_shards;  // ZeRO-3
  };
  ModelState(Model& model, OptimizerStep& optimizer, RankGroups& groups, MemoryHooks& hooks,
             OptimizerOptions options, Layout layout)
      : model_(model), optimizer_(optimizer), groups_(groups), hooks_(hooks), options_(options), layout_(layout) {}

  // Writes the checkpoint of `state` into `store` (every rank calls it); its folder as a line of
  // `progress` on the rank that knows it.
  void save(const CheckpointStore& store, const TrainerState& state, Progress& progress);
  // checkpoint.async, in two collectives (every rank calls each). take: the checkpoint of
  // `state` copied into host memory, its files not yet written (a rank that writes none holds
  // nothing); its `write` writes them on any thread. publish: once every rank's write returned,
  // the checkpoint renamed into place, or UserError on every rank where one could not write
  // (`late`: what ran meanwhile, for its message). Returns the folder.
  struct Taken {
    TrainerState state;
    bool sliced = false;
    int64_t host_bytes = 0;            // this rank's copy
    std::function<RankFiles()> write;  // never throws: RankFiles::why
  };
  Taken take(const CheckpointStore& store, const TrainerState& state);
  std::string publish(const CheckpointStore& store, const Taken& taken, const RankFiles& mine, const std::string& late);
  // Reads a verified checkpoint folder into the model and the optimizer; returns its trainer
  // state. Every rank's parameters and buffers are then the same as rank 0's.
  TrainerState load(const std::string& folder);

 private:
  // Checkpoints as slices (model_state_slices.cpp): where parameter `name`, a rank's tensor of
  // `sizes`, lies in the whole tensor a checkpoint records.
  struct CheckpointPart {
    SlicePart part;              // whole: the rank holds all of it
    std::vector<int64_t> sizes;  // the whole tensor's
    int64_t valid = 0;           // elements of the rank's tensor that are the whole's (the rest: padding)
    bool writer = true;          // this rank writes it (a replicated tensor: the group's first rank)
  };
  CheckpointPart checkpoint_part(const std::string& name, const std::vector<int64_t>& sizes) const;
  // Elements [offset, offset + values.numel()) of `param`'s memory order, as a slice of its whole.
  void add_slice(SliceFileWriter& out, const std::string& kind, const std::string& name, const at::Tensor& param,
                 int64_t offset, const at::Tensor& values) const;
  // Elements [offset, offset + length) of `param`'s memory order from the checkpoint (padding: zeros).
  at::Tensor read_slice(const SliceIndex& index, const std::string& kind, const std::string& name,
                        const at::Tensor& param, int64_t offset, int64_t length) const;
  std::vector<at::Tensor> read_slice_state(const SliceIndex& index, const std::string& name, const at::Tensor& param,
                                           int64_t offset, const at::Tensor& like) const;
  void save_sliced(const CheckpointStore& store, const TrainerState& state, Progress& progress);
  // fn over a group of every rank of the job (the replicas, by stage, by tensor-parallel rank).
  void with_job_group(const std::function<void(Communicator&)>& fn);
  // This rank's slices of a sliced checkpoint.
  void write_slices(SliceFileWriter& out) const;
  void write_pieces(SliceFileWriter& out, bool adamw) const;
  void write_parameters(SliceFileWriter& out, bool adamw) const;
  void write_state(SliceFileWriter& out, const std::string& name, const at::Tensor& param, int64_t offset,
                   const std::vector<at::Tensor>& state, bool adamw) const;
  TrainerState load_slices(const std::string& folder);
  void read_whole_tensors_from_slices(const SliceIndex& index, const std::string& folder);
  void read_pieces_from_slices(const SliceIndex& index);
  void read_state_from_slices(const SliceIndex& index);
  // Whether a sliced checkpoint's writer of whole tensors (each stage's first replica) writes
  // model parameter `index`: not another stage's, nor a tied weight's copy.
  bool writes_whole_parameter(size_t index, const at::Tensor& param) const;
  // Each parameter's name, by its TensorImpl; DataParallel's bucketed parameters (those the
  // shards split), by TensorImpl.
  std::map<const void*, std::string> parameter_names() const;
  std::set<const void*> bucketed_parameters() const;
  // Runs fn with the split parameters and their optimizer state whole on every rank of the
  // tensor-parallel group (gathered), then keeps this rank's parts again: what a whole checkpoint
  // (model.pt) is read into (model_state_tensor.cpp).
  void with_whole_tensors(const std::function<void()>& fn);
  // Less than the whole state on this rank: a checkpoint of slices.
  bool holds_part() const { return optimizer_.shard() != nullptr || groups_.tensor() != nullptr; }
  torch::optim::Optimizer& optimizer() const { return optimizer_.optimizer(); }

  Model& model_;
  OptimizerStep& optimizer_;
  RankGroups& groups_;
  MemoryHooks& hooks_;
  OptimizerOptions options_;
  Layout layout_;
};

}  // namespace ht

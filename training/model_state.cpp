// ModelState: which layout writes and reads a checkpoint how. Slices are in
// model_state_slices.cpp, a tensor-parallel rank's whole tensors in model_state_tensor.cpp.
#include "training/model_state.h"

#include "alloc/cpu_device_allocator.h"
#include "base/user_error.h"
#include "training/pipeline_setup.h"

namespace ht {

void ModelState::save(const CheckpointStore& store, const TrainerState& state, Progress& progress) {
  HostAllocationScope host;  // serialization buffers are host memory, not the device's
  if (!progress.silent()) {
    if (const std::string note = store.replacing(state.step); !note.empty()) progress.line("warning: " + note);
  }
  if (holds_part()) {
    save_sliced(store, state, progress);  // every rank writes what it holds
    return;
  }
  if (groups_.replicas().rank() != 0) return;  // the replicas hold the same state: rank 0 writes it
  if (PipelineStage* stage = layout_.stage.get()) {
    // Every stage's first replica takes part; rank 0 writes the whole model.
    std::string folder;
    with_full_model(*stage, model_, optimizer(), [&] {
      gather_to_first_stage(*stage, model_, optimizer());
      if (stage->rank() == 0) folder = store.save(model_, optimizer(), state);
    });
    if (!folder.empty()) progress.line("checkpoint " + folder);
    return;
  }
  progress.line("checkpoint " + store.save(model_, optimizer(), state));
}

ModelState::Taken ModelState::take(const CheckpointStore& store, const TrainerState& state) {
  HostAllocationScope host;  // the copy is host memory, not the device's
  Taken taken;
  taken.state = state;
  taken.sliced = holds_part();
  taken.write = [] { return RankFiles{}; };  // a rank that writes nothing
  if (taken.sliced) {
    std::shared_ptr<SliceFileWriter> writer;
    std::string folder;
    with_job_group([&](Communicator& job) {
      job.set_context("the checkpoint after step " + std::to_string(state.step));
      folder = store.begin_sliced(job, state.step);
      writer = std::make_shared<SliceFileWriter>(job.rank(), optimizer_name(optimizer()));
    });
    std::string why;  // a copy that failed (no host memory for it) fails the write, on every rank's word
    try {
      write_slices(*writer);
    } catch (const std::exception& e) {
      why = std::string("copying its slices to host memory: ") + e.what();
    }
    taken.host_bytes = writer->held_bytes();
    taken.write = [writer, folder, why] {
      RankFiles r;
      if (!why.empty()) {
        r.why = why;
        return r;
      }
      try {
        r.files = writer->write_to(folder);
      } catch (const std::exception& e) {
        r.why = e.what();
      }
      return r;
    };
    return taken;
  }
  if (groups_.replicas().rank() != 0) return taken;  // the replicas hold the same state: rank 0 writes it
  std::shared_ptr<WholeCheckpoint> files;
  std::string why;  // a copy that failed (no host memory for it) fails the write, on every rank's word
  auto copy = [&] {
    try {
      files = std::make_shared<WholeCheckpoint>(store.take(model_, optimizer(), state));
    } catch (const std::exception& e) {
      why = std::string("copying the checkpoint to host memory: ") + e.what();
    }
  };
  if (PipelineStage* stage = layout_.stage.get()) {
    with_full_model(*stage, model_, optimizer(), [&] {
      gather_to_first_stage(*stage, model_, optimizer());
      if (stage->rank() == 0) copy();
    });
  } else {
    copy();
  }
  if (!why.empty()) {
    taken.write = [why] { return RankFiles{why, {}}; };
    return taken;
  }
  if (!files) return taken;
  taken.host_bytes = files->bytes;
  taken.write = [files, store] {
    RankFiles r;
    try {
      store.write_unpublished(*files);
    } catch (const std::exception& e) {
      r.why = e.what();
    }
    return r;
  };
  return taken;
}

std::string ModelState::publish(const CheckpointStore& store, const Taken& taken, const RankFiles& mine,
                                const std::string& late) {
  std::string folder;
  with_job_group([&](Communicator& job) {
    job.set_context("the checkpoint after step " + std::to_string(taken.state.step));
    folder = store.finish(job, taken.state, mine, taken.sliced, late);
  });
  return folder;
}

TrainerState ModelState::load(const std::string& folder) {
  TrainerState state;
  OptimizerShard* shard = optimizer_.shard();
  PipelineStage* stage = layout_.stage.get();
  ParameterShards* parameter_shards = layout_.parameter_shards.get();
  if (holds_part() && SliceIndex::present(folder)) {
    state = load_slices(folder);  // each rank reads only what its stage, part and pieces hold
  } else if (TensorGroup* tensor = groups_.tensor()) {
    if (stage != nullptr || shard != nullptr) {
      throw UserError(folder + ": a whole checkpoint (model.pt, from a run without sharding or tensor parallelism) "
                      "resumes into tensor-parallel " + std::string(stage ? "pipeline stages" : "sharded replicas") +
                      " only through slices: resume it first at parallel.tensor_parallel = " +
                      std::to_string(tensor->size()) + " without pipeline stages or sharding (that run's checkpoints "
                      "are slices) and then from its checkpoint here, or here at parallel.tensor_parallel = 1");
    }
    // Whole tensors, whatever the layout that wrote them: each rank keeps its parts.
    with_whole_tensors([&] { state = CheckpointStore::load(folder, model_, optimizer()); });
  } else if (stage != nullptr && shard != nullptr) {
    // A whole checkpoint: the stage's whole state from it, then this rank's share of that.
    const std::unique_ptr<torch::optim::Optimizer> full = make_optimizer(options_, model_.parameters());
    with_full_model(*stage, model_, *full, [&] { state = CheckpointStore::load(folder, model_, *full); });
    shard->take_state(*full, optimizer());
  } else if (stage != nullptr) {
    // The checkpoint holds the whole model; a stage keeps its own share of it.
    with_full_model(*stage, model_, optimizer(), [&] { state = CheckpointStore::load(folder, model_, optimizer()); });
  } else if (shard != nullptr) {
    // A checkpoint of the whole state (an unsharded run's), whatever the number of ranks that wrote it.
    const std::unique_ptr<torch::optim::Optimizer> full = make_optimizer(options_, model_.parameters());
    if (parameter_shards != nullptr) {
      HostAllocationScope host;  // the whole parameters only while each rank takes its share
      parameter_shards->gather_all(hooks_);
    }
    state = CheckpointStore::load(folder, model_, *full);
    shard->take_state(*full, optimizer());
    if (parameter_shards != nullptr) {
      groups_.replicas().broadcast_state(model_.buffers());  // while the parameters are whole
      parameter_shards->take_from_whole();
      parameter_shards->release_all();
    }
  } else {
    state = CheckpointStore::load(folder, model_, optimizer());
  }
  // Every rank read the same files; make sure (sharded parameters have nothing whole to send).
  if (parameter_shards == nullptr) groups_.replicas().broadcast_state(model_.buffers());
  optimizer_.weights_changed();  // their 16-bit copies are made again at their next read
  return state;
}

}  // namespace ht

#pragma once
// When a checkpoint is written, chosen once (checkpoint.async): at its step, with training
// stopped until it is on disk (SyncCheckpointing), or copied into host memory at its step and
// written by a thread of its own while training goes on (AsyncCheckpointing: torchtitan's async
// DCP save, Megatron's --async-save). An async checkpoint is published (renamed into place, so
// that resume = "latest" finds it) only once every rank's files are on disk: a kill at any moment
// leaves the previous checkpoint whole. At most one write is in flight; a checkpoint step that
// finds the previous one still writing waits for it, and says so.
//
// Every rank calls every method at the same steps: whether every rank's write is done is agreed by
// one small all-reduce a step while one is in flight (Megatron polls the same way), so that every
// rank publishes after the same step.

#include "training/checkpoint.h"
#include "training/model_state.h"
#include "training/rank_groups.h"
#include "training/run_output.h"

#include <functional>
#include <future>
#include <memory>
#include <string>

namespace ht {

// One checkpoint, as the log and metrics.jsonl ("event": "checkpoint") record it.
struct CheckpointRecord {
  int64_t step = 0;
  std::string folder;
  bool async = false;
  int64_t host_bytes = 0;      // async: this rank's copy, held while its files are written
  double blocked_s = 0;        // training stopped for it: the whole save, or (async) the copy to host
  double waited_s = 0;         // async: the wait, at this checkpoint's step, for the one before
  double write_s = 0;          // async: the files' writing on their thread (this rank's)
  double publish_s = 0;        // async: every rank's outcome agreed, and the rename
  int64_t published_after = 0;  // async: the step after which it was published
};

class Checkpointing {
 public:
  using Published = std::function<void(const CheckpointRecord&)>;
  virtual ~Checkpointing() = default;
  // At a checkpoint step: the checkpoint of `state` (async: taken; published by a later call).
  virtual void save(const TrainerState& state) = 0;
  // After every step, at step `step`: an async write every rank finished is published.
  virtual void poll(int64_t step) = 0;
  // Before training ends or stops: the write in flight, finished and published.
  virtual void drain(int64_t step) = 0;
};

// `published` is called on every rank as each checkpoint is published. The store, the state and
// the groups outlive the part.
std::unique_ptr<Checkpointing> make_checkpointing(bool async, CheckpointStore store, ModelState& state,
                                                  RankGroups& groups, Progress& progress, Checkpointing::Published published);

}  // namespace ht

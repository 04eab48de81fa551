#pragma once
// The trainer's parts, chosen once from the resolved plan when the job is built: the one place
// that asks which parallel, memory and precision modes the run has. The trainer then runs the
// parts it was given (training/trainer.h), and a test may hand it one of its own (a gradient sync,
// say) without a line of the trainer changing. The mechanisms several parts share (a pipeline
// stage, ZeRO's shards, the gradients' slots) are held by each part that uses them and by the
// engine where its interpreter does, so a part replaced leaves no other dangling.
//
//   groups      the communicators of the grid's axes (training/rank_groups.h)
//   runner      LocalRunner | PipelineRunner                          (training/step_runner.h)
//   sync        LocalSync | AllReduceSync | ShardedSync, in a PipelineSync on stages
//                                                                     (training/gradient_sync.h)
//   optimizer   the optimizer over the parameters or ZeRO's pieces, its checks, the fp16 scaler,
//               the state's place                                    (training/optimizer_step.h)
//   state       checkpoints in the layout's form                      (training/model_state.h)
//
// Making them also lays the model's state out in the engine's memory, as the parts need it: the
// parameters in one block per dtype under a budget (in the all-reduce's order where sharded), or
// ZeRO-3's shards; the gradients' block; the memory manager's policy; a pipeline stage's share.

#include "training/engine.h"
#include "training/gradient_sync.h"
#include "training/model_state.h"
#include "training/optimizer_step.h"
#include "training/rank_groups.h"
#include "training/step_runner.h"

#include <memory>
#include <string>
#include <vector>

namespace ht {

// The communicators this rank trains in; null where the grid has no such axis (the replicas: a
// group of one).
struct RankCommunicators {
  std::shared_ptr<Communicator> replicas, pipeline, tensor;
  std::shared_ptr<Communicator> context;  // the context group (parallel.context_parallel)
};

struct TrainerParts {
  std::unique_ptr<RankGroups> groups;
  std::unique_ptr<StepRunner> runner;
  std::unique_ptr<GradientSync> sync;
  std::unique_ptr<OptimizerStep> optimizer;
  std::unique_ptr<ModelState> state;
  std::vector<std::string> notes;        // lines for the log as the trainer starts (the first rank's)
  std::vector<std::string> description;  // how the work is split (a pipeline's stages), for the plan's lines
};

// Whether the fp32 weights are sharded with the optimizer at ZeRO-1 and ZeRO-2 (parallel/
// shard_layout.h, shards_masters, of the resolved plan). The parameters are then ParameterShards'
// resident ones (parallel/parameter_shards.h): each rank keeps its fp32 share, and the 16-bit
// copies are gathered once a step.
bool shards_masters(const RunPlan& plan);

// The parts of `plan`'s trainer over `engine`. `data`: the probe of a pipeline's blocks. Throws
// UserError where the plan cannot be laid out (a pipeline cut the model does not allow).
TrainerParts make_trainer_parts(const RunPlan& plan, const DataSplits& data, Engine& engine, RankCommunicators comms);

}  // namespace ht

#pragma once
// The gradient sync: what a step does with this rank's gradients between backward and the
// optimizer, so that every replica steps on the same ones. One part of the trainer, chosen once
// when the job is built (training/trainer_parts.h), as flashlight chooses its gradient reducer:
//
//   LocalSync        one replica: nothing to combine (a gradient block under a budget is still
//                    laid out in the reduction order, alloc/gradient_buffer.h)
//   AllReduceSync    data parallelism: buckets all-reduced as backward finishes them, then means
//                    (parallel/data_parallel.h); ZeRO-1 too, whose optimizer shards only the state
//   ShardedSync      ZeRO-2 and ZeRO-3: every micro-batch's backward reduce-scatters each bucket
//                    into this rank's share (parallel/gradient_shards.h); at ZeRO-3 the gathered
//                    parameters are released after each backward (parallel/parameter_shards.h)
//   PipelineSync     pipeline stages: a tied weight's two gradients summed across the first and
//                    last stage, then the stage's replicas' sync
//
// Tensor parallelism adds no sync of its own: its ops combine the split layers' gradients inside
// backward (tp_copy's backward all-reduces; runtime/ops/tensor_parallel.cpp), and what it changes
// after backward is the global norm, which the optimizer step's checks count over the group
// (training/step_checks.h).
//
// The combination is asynchronous: begin() starts what backward has not started and returns a
// handle at once; the gradients are the step's when the handle's wait() returns: the buckets run
// on the group's CollectiveQueue (parallel/collective_queue.h), a worker thread's on CPU ranks; on
// a GPU the communication stream's, and wait() makes the compute stream wait for their events.

#include "base/json.h"
#include "parallel/data_parallel.h"
#include "runtime/gradient_listener.h"

#include <memory>

namespace ht {

// A combination under way.
class SyncHandle {
 public:
  virtual ~SyncHandle() = default;
  // Returns when it is done (the gradients are then the step's); rethrows what it met.
  virtual void wait() = 0;
};

// A handle whose work was done when it was made.
class DoneHandle final : public SyncHandle {
 public:
  void wait() override {}
};

class GradientSync {
 public:
  virtual ~GradientSync() = default;
  // Who hears a micro-batch's backward finish each parameter's gradient, so that a bucket's
  // combination begins while backward goes on; null: nobody. `last`: the step's last micro-batch
  // (an earlier one's gradients are still to be added to).
  virtual GradientListener* listener(bool last) { return nullptr; }
  // After each micro-batch's backward (also the last).
  virtual void backward_ended() {}
  // After the step's last backward: begins combining what backward did not begin.
  virtual std::unique_ptr<SyncHandle> begin() = 0;
  // Of the last step: the collectives' time, bytes and overlap.
  virtual DataParallelStats stats() const { return {}; }
  // Its fields of a step's metrics record (nothing where it combined nothing).
  virtual void record(JsonObject& record) const {}
};

// One replica: nothing to combine.
class LocalSync final : public GradientSync {
 public:
  std::unique_ptr<SyncHandle> begin() override { return std::make_unique<DoneHandle>(); }
};

}  // namespace ht

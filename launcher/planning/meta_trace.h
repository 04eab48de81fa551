#pragma once
// A training micro-batch of the configured model (forward and backward) traced on meta tensors:
// the model is built on the meta device (models/layers.h, MetaParametersScope) and the step runs
// through the same interpreter, ops and memory manager as training, in an arena whose blocks are
// placed as a device arena places them but hold no memory (alloc/meta_arena.h). What the
// StepRecorder records is then every tensor the engine would create, save and free, with its
// bytes and lifetime, in the engine's order, for a model of any size, in no memory and in
// seconds. The same function runs the step on data (meta = false) for the comparison that pins
// the trace to the engine (tests/launcher/test_meta_trace.cpp). Ops whose kernels have no meta
// kernel in libtorch 1.13 allocate their outputs' shapes themselves (runtime/op.h).
//
// With parallel.tensor_parallel > 1, rank 0's part, its group mirrored (MirrorCommunicator, as
// the profiler does); with training.mixed_precision, under autocast; then the optimizer's first
// step. Every model kind traces (convolutions, batch norm and ReLU declare their outputs' shapes),
// in the contiguous layout (training.channels_last is not applied yet). Not traced: ATen kernels'
// own workspaces (a meta kernel allocates only its outputs; on this CPU a convolution's im2col
// and reorder buffers are the large ones: the difference is measured in the test).

#include "launcher/config/config.h"
#include "launcher/data/dataset.h"
#include "planner/step_trace.h"

#include <cstdint>

namespace ht {

struct TracedStep {
  StepTrace trace;             // forward and backward of one micro-batch, as the recorder saw it
  int64_t parameters = 0;      // elements
  int64_t model_bytes = 0;     // the parameters and buffers, as allocated before the step (arena blocks)
  int64_t step_peak_bytes = 0; // the arena's peak during forward and backward, above model_bytes (placement included)
  // The optimizer's first step on those gradients (the config's optimizer, no clipping): the
  // state it makes, and its peak above what was in use before it (the state and its temporaries).
  int64_t optimizer_state_bytes = 0, optimizer_peak_bytes = 0;
  double seconds = 0;          // the whole trace, model built included
};

// `micro_batch` samples of the config's sequence length (model.block_size) or sample shape.
// `capacity`: the meta arena's address space, reserved without access (32 TiB holds a 175B shape's
// step). With meta = false, the same step on random data in a CPU arena (at most 64 GiB).
TracedStep trace_micro_batch(const Config& config, const DataInfo& info, int64_t micro_batch, bool meta = true,
                             int64_t capacity = int64_t{1} << 45);

}  // namespace ht

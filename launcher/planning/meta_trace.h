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
// two steps. Every model kind traces (convolutions, batch norm and ReLU declare their outputs' shapes),
// in the job's layout (training.channels_last restrides the convolutions' weights, as the job
// does, and ATen's rule carries it to the activations). ATen kernels' own
// workspaces (a meta kernel allocates only its outputs; on this CPU a convolution's im2col and
// reorder buffers are the large ones) are held by the ops inside a DeclaredWorkspaces scope
// (runtime/kernel_workspace.h); outside one, not traced.

#include "launcher/config/config.h"
#include "launcher/data/dataset.h"
#include "models/model.h"
#include "planner/step_trace.h"
#include "schedule/step_graph.h"

#include <cstdint>
#include <memory>
#include <unordered_map>

namespace ht {

struct TracedStep {
  StepTrace trace;             // forward and backward of one micro-batch, as the recorder saw it
  int64_t parameters = 0;      // elements
  int64_t model_bytes = 0;     // the parameters and buffers, as allocated before the step (arena blocks)
  int64_t step_peak_bytes = 0; // the arena's peak during forward and backward, above model_bytes (placement included)
  // The optimizer's first steps on those gradients (the config's optimizer, no clipping): the
  // state they make, and their peak above what was in use before (the state and the larger
  // step's temporaries: launcher/planning/meta_trace.h, trace_optimizer_step).
  int64_t optimizer_state_bytes = 0, optimizer_peak_bytes = 0;
  double seconds = 0;          // the whole trace, model built included
};

// What a planner's profile takes from a traced micro-batch beside the trace
// (launcher/planning/trace_profile.h): set the inputs, read the outputs.
class GradientSlots;

struct TraceExtras {
  const GradientSlots* gradients = nullptr;  // the trainer's gradient block (alloc/gradient_buffer.h)
  // Each parameter's bucket, cut at blocks (launcher/planning/profile_parts.h): backward kernels
  // record the buckets whose gradients they make, and the buckets backward reads are noted.
  const std::unordered_map<const c10::TensorImpl*, size_t>* bucket_of = nullptr;
  bool capture_graph = false;  // also capture the step as static plans do
  // The interpreter's seed counter before the step, and after it: a graph that changes every
  // step draws its path from the seeds (job.seed's stream, as the trainer's), so steps traced
  // with the counter carried over are the trainer's steps in order.
  uint64_t seed_counter = 0;
  std::vector<size_t> backward_read_buckets;
  std::vector<size_t> backward_copy_buckets;                     // ProfilePoint's
  std::vector<size_t> backward_fp32_buckets;                     // ProfilePoint's
  std::vector<size_t> half_read_buckets;                         // ProfilePoint's
  std::vector<std::pair<size_t, int64_t>> fp32_read_elements;    // ProfilePoint's
  schedule::StepGraph graph;
  std::vector<int> block_starts;
  std::vector<uint64_t> signatures;  // per forward op: what a run's step must match (memory/step_capture.h)
  uint64_t sequence_hash = 0;
};

class CpuArena;

// A micro-batch of `micro_batch` samples (meta tensors, or random data) and its forward and
// backward through the interpreter, recorded into out.trace and out.step_peak_bytes (above what
// was in use before: the model, its gradients, the batch). Under config's mixed precision and,
// with parallel.tensor_parallel > 1 or parallel.context_parallel > 1, as rank 0 of mirrored groups.
// With parallel.context_parallel = c (`context`), a language model's batch is rank 0's part of
// each sequence: T / c tokens.
std::pair<at::Tensor, at::Tensor> traced_batch(const DataInfo& info, int64_t micro_batch, bool meta, int64_t context = 1);
void trace_forward_backward(const Config& config, Model& model, const std::shared_ptr<CpuArena>& arena,
                            const at::Tensor& x, const at::Tensor& y, TracedStep& out, TraceExtras* extras = nullptr);
// The optimizer's first two steps on the gradients backward left: out.optimizer_state_bytes (the
// first makes it) and out.optimizer_peak_bytes (the state and the larger step's temporaries).
// `fused_pass`: the traced device steps in one fused pass (training/fused_optimizer.h: this CPU's,
// or ATen's multi-tensor AdamW on a GPU), which allocates only the state; false: torch::optim's
// kernels, with their temporaries.
void trace_optimizer_step(const Config& config, Model& model, CpuArena& arena, TracedStep& out, bool fused_pass);

// Whether a GPU run steps its optimizer fused, in ATen's multi-tensor kernels (libtorch >= 2.4,
// what GPU builds take: docs/engine.md; training/fused_optimizer_cuda.h): AdamW with fp32
// moments, SGD with gradients of the parameters' type. AdamW's moments in bf16, and SGD's bf16
// gradients (training.gradient_dtype = "bf16"; "auto" counts as fp32, though a plan may choose
// bf16 for it), step in torch::optim's kernels.
inline bool fused_on_gpu(const TrainingConfig& t) {
  if (t.optimizer == OptimizerKind::kAdamw) return t.optimizer_state_dtype == StateDtype::kFp32;
  return !keeps_bf16_gradients(t.gradient_dtype, t.mixed_precision);
}
// Whether `config`'s run on this build steps fused: on a CPU always, on a GPU as fused_on_gpu
// where this libtorch has the kernel.
bool steps_fused_here(const Config& config);

// `micro_batch` samples of the config's sequence length (model.block_size) or sample shape.
// `capacity`: the meta arena's address space, reserved without access (32 TiB holds a 175B shape's
// step). With meta = false, the same step on random data in a CPU arena (at most 64 GiB).
TracedStep trace_micro_batch(const Config& config, const DataInfo& info, int64_t micro_batch, bool meta = true,
                             int64_t capacity = int64_t{1} << 45);

}  // namespace ht

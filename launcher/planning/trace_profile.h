#pragma once
// A job's ModelProfile from steps traced on meta tensors (launcher/planning/meta_trace.h),
// priced on a catalog device (planner/op_time.h): what `hybrid_train plan` plans a cluster from,
// for a model of any size, in no memory and in seconds, where profiling would have to train it
// on the device planned for.
//
// Memory is the trace's, to the byte of the arena's placement: the model's parameters, the
// gradient block the trainer allocates, the optimizer's state after its first step, each
// micro-batch's activations, and the kernels' own workspaces where the request names their rules
// (runtime/kernel_workspace.h: this CPU's; none for a catalog GPU yet).
// Time is each traced kernel's work at the device's rates, summed per block and per step; the
// optimizer's from the bytes its kernels move. Each (precision, micro-batch) point is one trace;
// the model is built once per tensor-parallel size.

#include "launcher/config/config.h"
#include "launcher/data/dataset.h"
#include "launcher/planning/meta_trace.h"
#include "planner/op_time.h"
#include "planner/profile.h"
#include "runtime/kernel_workspace.h"

#include <vector>

namespace ht {

struct TraceRequest {
  std::vector<MixedPrecision> precisions{MixedPrecision::kBf16};
  std::vector<int64_t> micro_batches{1, 2};  // traced sizes (the cost model interpolates between them)
  // Larger sizes are not traced once a traced size's activations alone exceed this (no plan at
  // such a size fits; the cost model extrapolates from the two largest traced); 0: trace all.
  int64_t device_memory = 0;
  DeviceRates rates;
  int64_t train_samples = 0;  // the training set's size where known (epochs, the sampler's memory)
  // The kernels' workspaces to declare: kThisCpu for a plan of this machine (a meta kernel
  // allocates only its outputs; a convolution's reorders set a ConvNet's peak). Under rules
  // every size in micro_batches is traced: workspaces are not affine in the micro-batch.
  WorkspaceRules workspaces = WorkspaceRules::kNone;
  // The traced device is a GPU: the ops whose kernels differ by device take the GPU's on the meta
  // tensors (runtime/traced_device.h: attention's blocks, layer norm's bf16 path).
  bool gpu = false;
  // The traced device steps the optimizer in one fused pass without temporaries
  // (training/fused_optimizer.h: this CPU's pass, or AdamW in ATen's multi-tensor kernel on a GPU:
  // fused_on_gpu in launcher/planning/meta_trace.h); false: torch::optim's kernels and their temporaries run.
  bool fused_optimizer = false;
  // A decoder of more layers than this, traced without workspaces, is traced through three and
  // four of its layers and its step stretched to its depth (launcher/planning/layer_traces.h),
  // where the four-layer step checks the stretch; else (or where it does not check) every layer.
  int64_t stretch_beyond_layers = 8;
};

// `config` with the parallel.tensor_parallel and sequence_parallel to trace (a rank's part).
ModelProfile trace_profile(const Config& config, const DataInfo& info, const TraceRequest& request);

}  // namespace ht

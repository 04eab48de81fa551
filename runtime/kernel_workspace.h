#pragma once
// What a kernel allocates for itself beside its outputs (its workspace), declared per op
// (OpTraits::workspace) so that a step traced on meta tensors (launcher/planning/meta_trace.h)
// holds the same bytes at the same moment as the step on data. A meta kernel allocates only its
// outputs; the data kernel's temporaries (a convolution's reorder or im2col buffers, batch norm's
// statistics, layer norm's per-thread partial sums) are what set a convolutional network's peak.
//
// Workspaces belong to a backend, not to the op: the rules here are this CPU's (libtorch 1.13's
// ATen kernels and oneDNN, measured allocation by allocation against the data run in
// tests/launcher/test_meta_trace.cpp). A trace declares them only inside a
// `DeclaredWorkspaces` scope naming the rules; without one (a trace for a GPU of the catalog,
// whose cuDNN and cuBLAS workspaces are not measured yet: scripts/device-calibrate.py's
// `workspaces` table is what CUDA rules are to be fitted to) an op declares none.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace ht {

// The kind of temporary an op's kernel makes: data on the op (OpTraits::workspace).
enum class Workspace : uint8_t {
  kNone,
  kConvolution,  // oneDNN's reorders of input, weight and output; or im2col columns (THNN)
  kBatchNorm,    // per-channel statistics in fp32 beside the saved ones; channels-last backward's sums
  kMaxPool,      // backward: its indices and input gradient converted to the output gradient's layout
  kLayerNorm,    // backward: per-thread partial sums of the weight and bias gradients
};

enum class WorkspaceRules : uint8_t {
  kNone,     // declare nothing (no scope, or a device whose kernels' workspaces are not measured)
  kThisCpu,  // libtorch 1.13's CPU kernels with oneDNN, as measured on this machine
};

// While alive, ops on meta tensors on this thread declare their workspaces by `rules`.
class DeclaredWorkspaces {
 public:
  explicit DeclaredWorkspaces(WorkspaceRules rules);
  ~DeclaredWorkspaces();
  DeclaredWorkspaces(const DeclaredWorkspaces&) = delete;
  DeclaredWorkspaces& operator=(const DeclaredWorkspaces&) = delete;
  static WorkspaceRules current();

 private:
  WorkspaceRules previous_;
};

// The shapes a workspace depends on. Convolution: input (N, C, H, W), weight (O, C/g, kh, kw),
// output; stride, padding, groups. Norms: input and the normalized size. Pooling: input and output.
struct WorkspaceQuery {
  bool backward = false;
  bool input_grad = true;   // backward: the input's gradient is wanted
  bool weight_grad = true;  // backward: the weight's gradient is wanted
  // Convolution: the kernel runs channels-last (the input or the weight is: ATen's rule), and
  // copies an input that is not channels-last-contiguous before it does. Batch norm: its input is
  // channels-last. Max pooling: the output's gradient is not in the input's layout.
  bool channels_last = false;
  bool input_copied = false;
  at::IntArrayRef input, weight, output;
  at::IntArrayRef stride, padding;
  int64_t groups = 1;
  int64_t normalized = 0;    // layer norm: elements normalized together (the last dimensions)
  int64_t element_bytes = 4;
  int threads = 1;           // ATen's intra-op threads (layer norm's per-thread sums)
};

// Whether this build's libtorch is the one kThisCpu was measured against (1.13): under another,
// kThisCpu declares nothing, and a trace of this machine misses its kernels' workspaces. The
// convolution rules were measured on a CPU with AVX-512's core; without it oneDNN takes other
// kernels with larger scratchpads, and a trace is a lower bound (ResNet at micro-batch 4 on an
// AVX2 EPYC: 47.8 MB traced, 71.3 MB held).
bool this_cpu_workspaces_known();

// The blocks (bytes each, as the kernel requests them) a kernel of `kind` holds at its peak
// beyond its outputs, under `rules`.
std::vector<int64_t> workspace_blocks(Workspace kind, const WorkspaceQuery& query, WorkspaceRules rules);

// On meta tensors, inside a DeclaredWorkspaces scope: the blocks of `kind`, allocated as meta
// tensors through the meta arena (so the recorder sees them in the kernel). The caller holds them
// while its outputs exist and drops them on return, as the data kernel frees its own.
std::vector<at::Tensor> hold_meta_workspace(Workspace kind, const WorkspaceQuery& query);

}  // namespace ht

#include "runtime/kernel_workspace.h"

#include "base/compat.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace ht {
namespace {

thread_local WorkspaceRules declared = WorkspaceRules::kNone;

int64_t numel(at::IntArrayRef sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

// libtorch 1.13's choice of kernel for a CPU convolution (aten/src/ATen/native/Convolution.cpp,
// use_mkldnn, for fp32; bf16 always takes oneDNN): THNN's im2col for a single small image with a
// small filter, oneDNN otherwise.
bool uses_onednn(const WorkspaceQuery& q) {
  if (q.element_bytes == 2) return true;
  const int64_t kh = q.weight[2], kw = q.weight[3];
  const bool strided = q.stride[0] != 1 || q.stride[1] != 1;
  return (strided || q.input[0] >= 16 || kh != 1 || kw != 1 || q.threads > 1) &&
         (q.groups > 1 || (kh > 3 && kw > 3) || q.input[0] > 1 || numel(q.input) > 20480);
}

// Measured (tests/launcher/test_meta_trace.cpp, ResNet and the supernet at micro-batch 1, 4, 8):
// oneDNN reorders the input (but a first layer's few channels, which it reads as they are) and the
// weight into its blocked layouts, and writes the output blocked before the plain copy: forward
// holds max(input + weight, output) beyond the output. Backward reorders the output's gradient and
// the input for the weight's gradient, whose blocked copy sits beside the plain one:
// max(input + grad, weight). THNN (im2col) holds the columns, channels x filter x output pixels,
// in either direction (none for a 1x1 filter of stride 1 without padding).
int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

// Channels-last (measured the same way, shapes of 3 to 256 channels, filters 1x1 and 3x3, strides
// 1 and 2, one and two threads): ATen first copies an input that is not channels-last. oneDNN then
// reads input and output as they are; forward reorders the weight into blocks of 16 output
// channels, beside a scratchpad of a page per thread and one more. Backward's input gradient reads
// the weight in blocks of 16 input and output channels; its weight gradient is written blocked
// (16 output channels) and copied out through a plain one. With more than one thread the weight
// gradient's reduction adds a few KiB on some shapes (not declared: under 9 KiB measured).
std::vector<int64_t> channels_last_convolution(const WorkspaceQuery& q) {
  const int64_t b = q.element_bytes;
  const int64_t per_output = numel(q.weight) / q.weight[0] * b;  // one output channel's weights
  const int64_t weight = q.weight[0] * per_output;
  const int64_t by_16_outputs = round_up(q.weight[0], 16) * per_output;
  const int64_t by_16_both = round_up(q.weight[0], 16) * round_up(q.weight[1], 16) * q.weight[2] * q.weight[3] * b;
  std::vector<int64_t> blocks;
  if (q.input_copied) blocks.push_back(numel(q.input) * b);
  if (!q.backward) {
    blocks.push_back(4096 * (std::max(1, q.threads) + 1));
    blocks.push_back(by_16_outputs);
    return blocks;
  }
  if (!q.weight_grad) {
    blocks.push_back(by_16_both);
  } else if (q.input_grad && by_16_both - weight > by_16_outputs + weight) {
    blocks.push_back(by_16_both - weight);  // the input gradient's weight, before the weight gradient exists
  } else {
    blocks.push_back(by_16_outputs);
    blocks.push_back(weight);
  }
  return blocks;
}

std::vector<int64_t> convolution(const WorkspaceQuery& q) {
  const int64_t b = q.element_bytes;
  const int64_t input = numel(q.input) * b, weight = numel(q.weight) * b, output = numel(q.output) * b;
  if (q.channels_last && b == 4) {
    if (uses_onednn(q)) return channels_last_convolution(q);
    std::vector<int64_t> blocks;  // THNN's channels-last im2col, after ATen's copy of the input
    if (q.input_copied) blocks.push_back(input);
    const bool pointwise = q.weight[2] == 1 && q.weight[3] == 1 && q.stride[0] == 1 && q.stride[1] == 1 &&
                           q.padding[0] == 0 && q.padding[1] == 0;
    if (!pointwise) blocks.push_back(q.input[0] * q.weight[1] * q.weight[2] * q.weight[3] * q.output[2] * q.output[3] * b);
    return blocks;
  }
  if (uses_onednn(q)) {
    const int64_t reordered_input = q.input[1] >= 8 ? input : 0;
    if (!q.backward) {
      if (reordered_input + weight >= output) return {reordered_input, weight};
      return {output};
    }
    if (!q.weight_grad) return {output, weight};
    if (reordered_input + output >= weight) return {reordered_input, output};
    return {weight};
  }
  const bool pointwise = q.weight[2] == 1 && q.weight[3] == 1 && q.stride[0] == 1 && q.stride[1] == 1 &&
                         q.padding[0] == 0 && q.padding[1] == 0;
  if (pointwise) return {};
  return {q.input[0] * q.weight[1] * q.weight[2] * q.weight[3] * q.output[2] * q.output[3] * b};
}

}  // namespace

DeclaredWorkspaces::DeclaredWorkspaces(WorkspaceRules rules) : previous_(declared) { declared = rules; }
DeclaredWorkspaces::~DeclaredWorkspaces() { declared = previous_; }
WorkspaceRules DeclaredWorkspaces::current() { return declared; }

bool this_cpu_workspaces_known() {
#ifdef HT_CPU_WORKSPACES_MEASURED
  return true;
#else
  return false;
#endif
}

std::vector<int64_t> workspace_blocks(Workspace kind, const WorkspaceQuery& q, WorkspaceRules rules) {
  if (rules != WorkspaceRules::kThisCpu || !this_cpu_workspaces_known()) return {};
  std::vector<int64_t> blocks;
  switch (kind) {
    case Workspace::kNone:
      break;
    case Workspace::kConvolution:
      blocks = convolution(q);
      break;
    case Workspace::kBatchNorm:  // the batch's mean and variance per channel, in fp32
      if (!q.backward) blocks = {q.input[1] * 4, q.input[1] * 4};
      if (q.backward && q.channels_last) blocks = {2 * q.input[1] * 4};  // both sums per channel
      break;
    case Workspace::kMaxPool:  // ATen's kernel runs in the output gradient's layout (int64 indices)
      if (q.backward && q.input_copied) blocks = {numel(q.output) * 8, numel(q.input) * q.element_bytes};
      break;
    case Workspace::kLayerNorm:  // a row of weight and of bias gradient sums per thread, in fp32
      if (q.backward && q.weight_grad) blocks = {std::max(1, q.threads) * 2 * q.normalized * 4};
      break;
  }
  blocks.erase(std::remove(blocks.begin(), blocks.end(), int64_t{0}), blocks.end());
  return blocks;
}

std::vector<at::Tensor> hold_meta_workspace(Workspace kind, const WorkspaceQuery& query) {
  std::vector<at::Tensor> held;
  for (int64_t bytes : workspace_blocks(kind, query, declared)) {
    held.push_back(at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(at::kMeta)));
  }
  return held;
}

}  // namespace ht

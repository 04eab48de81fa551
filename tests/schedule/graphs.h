#pragma once
// Step graphs shaped like real networks for the schedule tests (and for measuring the solver):
// a builder where each forward op names what its backward stage reads, and a few generators.

#include "schedule/step_graph.h"

#include <cstdint>
#include <vector>

namespace ht::schedule::testing {

// Forward ops in order; finish() adds one backward stage per op, in reverse order, reading what
// the op saved, and derives last_forward_use from the inputs.
class GraphBuilder {
 public:
  // An op reading `inputs` and computing one value per entry of `output_bytes`; returns them.
  std::vector<int> op(const std::vector<int>& inputs, const std::vector<int64_t>& output_bytes, double cost_ms,
                      int64_t working_bytes = 0);
  int op1(const std::vector<int>& inputs, int64_t bytes, double cost_ms) { return op(inputs, {bytes}, cost_ms)[0]; }
  // What the backward stage of the last op added reads, and its working bytes.
  void saves(const std::vector<int>& values, int64_t working_bytes = 0);
  void not_droppable(int value) { graph_.values[value].droppable = false; }
  StepGraph finish(int64_t fixed_bytes = 0);

 private:
  StepGraph graph_;
  std::vector<std::vector<int>> saved_;
  std::vector<int64_t> stage_working_;
};

// op i reads value i - 1 and computes value i (1 byte, 1 ms); its stage reads value i - 1.
StepGraph chain(int n);
// A ResNet: stem, `blocks_per_stage` basic blocks (conv-bn-relu-conv-bn, add, relu) per stage,
// a downsampling shortcut where the width doubles, pooling, linear and loss. resnet(4, 2): 70 ops.
StepGraph resnet(int stages, int blocks_per_stage);
// A GPT: embeddings, `layers` pre-norm blocks of 18 ops (fused attention saving q, k, v, its
// output and log-sum-exp; dropout masks; residual adds), final norm, head and loss.
StepGraph gpt(int layers);
// `ops` ops, each reading the previous value and sometimes one of the last 16, some with two
// outputs; costs and bytes drawn from `seed`.
StepGraph random_skips(int ops, uint32_t seed);

}  // namespace ht::schedule::testing

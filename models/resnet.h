#pragma once
#include "models/layers.h"
#include "models/model.h"

namespace ht {

struct ResNetOptions {
  int depth = 18;                     // 18 and 34: BasicBlock; 50: Bottleneck
  int64_t width = 64;                 // channels of the first stage (x2 per stage)
  std::vector<int64_t> stage_blocks;  // blocks per stage; empty: the depth's standard [2,2,2,2]...
  int64_t in_channels = 3;
  int64_t classes = 10;
  bool small_input = true;            // 3x3 stride-1 stem without max pool (CIFAR, 28x28);
                                      // false: the ImageNet 7x7 stride-2 stem with max pool
};

// He et al. 2016. Blocks: the stem, every residual block, and the head (global average pool and
// linear), so a pipeline can cut between any two residual blocks.
class ResNet : public Model {
 public:
  explicit ResNet(const ResNetOptions& options);
};

}  // namespace ht

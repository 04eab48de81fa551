#pragma once
#include "models/layers.h"
#include "models/model.h"

namespace ht {

struct ConvNetOptions {
  int64_t in_channels = 1;
  int64_t image_size = 28;             // square inputs, divisible by 2^len(channels)
  std::vector<int64_t> channels{32, 64};
  int64_t hidden = 128;
  int64_t classes = 10;
  double dropout = 0.25;
};

// The small net for 28x28 images:
//   [conv3x3 -> batch norm -> relu -> max pool 2] x len(channels)
//   -> flatten -> linear(hidden) -> relu -> dropout -> linear(classes)
class ConvNet : public Model {
 public:
  explicit ConvNet(const ConvNetOptions& options);
};

}  // namespace ht

#pragma once
#include "models/layers.h"
#include "models/model.h"

namespace ht {

struct MlpOptions {
  int64_t in_features = 784;              // inputs are flattened to (B, in_features)
  std::vector<int64_t> hidden{256, 256};  // one block per hidden layer
  int64_t classes = 10;
  double dropout = 0.0;
};

// (B, ...) -> flatten -> [linear -> relu -> dropout] x hidden -> linear -> (B, classes)
class Mlp : public Model {
 public:
  explicit Mlp(const MlpOptions& options);
};

}  // namespace ht

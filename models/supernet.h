#pragma once
#include "models/layers.h"
#include "models/model.h"

namespace ht {

struct SupernetOptions {
  int64_t in_channels = 3;
  int64_t image_size = 32;
  int64_t width = 32;       // channels of every choice block
  int64_t num_blocks = 4;   // choice blocks; the middle one halves the resolution
  int64_t classes = 10;
};

// A single-path one-shot supernet (SPOS, Guo et al. 2020): every choice block holds several
// candidate ops (conv3x3, conv5x5, depthwise-separable 3x3, identity) and runs one of them,
// drawn from the interpreter's seed stream on every forward. The graph changes every step;
// candidates not chosen get no gradient that step.
class Supernet : public Model {
 public:
  explicit Supernet(const SupernetOptions& options);
  // The candidate each choice block ran in the last forward (for tests and logging).
  std::vector<int64_t> last_choices() const;
  bool changes_every_step() const override { return true; }
  static constexpr int64_t kCandidates = 4;
};

}  // namespace ht

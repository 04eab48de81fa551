#pragma once
// A run's decoder with its latest weights, found the way `hybrid_train report RUN_DIR` finds its
// run: RUN_DIR/config.resolved.toml describes the model (and the data, whose tokens `sample`
// needs), and the newest checkpoint that verifies (checkpoint.dir, else RUN_DIR/checkpoints)
// holds the weights. `hybrid_train export` and `hybrid_train sample` both start here.

#include "launcher/config/config.h"
#include "models/decoder.h"

#include <memory>
#include <string>

namespace ht {

struct RunWeights {
  Config config;
  std::string checkpoint;  // the folder the weights came from
  DecoderOptions options;
  std::shared_ptr<Decoder> model;  // in evaluation mode, on the CPU, float32
};

// UserError naming RUN_DIR when it is no run folder, its model is not a decoder, or it holds no
// checkpoint; `command` ("export", "sample") names what wanted it.
RunWeights load_run_weights(const std::string& run_dir, const std::string& command);

}  // namespace ht

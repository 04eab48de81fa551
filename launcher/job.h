#pragma once
// One training job from a validated config: data, model, resume point, training, outputs.
// hybrid_train's main() and the integration tests both run jobs through this.

#include "launcher/config/config.h"
#include "training/trainer.h"
#include "parallel/process_grid.h"
#include "models/model.h"

#include <memory>

namespace ht {

struct JobOutcome {
  std::shared_ptr<Model> model;  // trained parameters and buffers
  TrainResult result;
};

// Throws UserError for bad input before writing anything. `quiet` skips the resolved config and
// plan on stdout (tests).
// `grid`: the ranks of an mpirun job (null: a single process). Rank 0 prints and writes the
// outputs; every rank trains its replica.
JobOutcome run_job(const Config& config, bool quiet = false, const ProcessGrid* grid = nullptr);

}  // namespace ht

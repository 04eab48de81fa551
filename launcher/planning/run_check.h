#pragma once
// Before every training run: predict the run's own peak memory and step time from a profiled
// step, refuse a run that cannot fit its budget or device (UserError naming the predicted peak,
// the limit, and the cheapest plans that would fit), and under parallel.strategy = "auto" replace
// the plan's micro-batch size and memory policy with the planner's fastest fitting choice.
// Rank 0 decides and every rank follows, so that all refuse or all train the same plan.

#include "launcher/config/config.h"
#include "launcher/data/dataset.h"
#include "parallel/process_grid.h"
#include "planner/cost_model.h"
#include "training/run_plan.h"

#include <optional>
#include <string>

namespace ht {

struct RunPrediction {
  Plan plan;
  Prediction prediction;   // rank 0's; other ranks keep an empty one
  int64_t limit_bytes = 0;  // the budget, or the device's (host's) share per rank
  std::string text;        // one line for the log
};

// Changes `run` where the planner decides (parallel.strategy = "auto", memory.policy = "auto").
// Throws UserError when the run cannot fit.
RunPrediction check_run_fits(const Config& config, RunPlan& run, const DataSplits& data, const ProcessGrid& grid);

}  // namespace ht

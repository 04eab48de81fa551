#pragma once
// Profiles a job for the planner: a copy of its model, in an arena of its own, trains one step
// per measured point (after a warm-up step) through the real Trainer, so that parameters,
// gradients, optimizer state, batch and activations are the ones training will have, to the byte.
// The job's own model, data order and seeds are untouched.

#include "launcher/config/config.h"
#include "launcher/data/dataset.h"
#include "planner/profile.h"

#include <string>
#include <vector>

namespace ht {

struct ProfileRequest {
  std::vector<MixedPrecision> precisions{MixedPrecision::kOff};  // training.mixed_precision values to measure
  int64_t largest_micro_batch = 1;             // the largest micro-batch a plan may use
  // The micro-batch sizes to train; empty: every power of two up to the largest (or up to where
  // a step passes point_ms_cap) and the largest, each of which a plan may use.
  std::vector<int64_t> sizes;
  int threads = 1;                             // compute threads of one rank alone here
  bool one_thread_point = false;               // also measure with one thread (ranks sharing cores)
  double point_ms_cap = 400;                   // keep each point's step near this (extrapolate beyond)
};

// `train`: the job's training set (samples are read from its start). Throws UserError when the
// model does not fit host memory.
ModelProfile profile_job(const Config& config, const Dataset& train, const DataInfo& info,
                         const ProfileRequest& request);

}  // namespace ht

#pragma once
// The splits of a replica's ranks that a plan searches (planner/plan.h, RankSplit): the
// tensor-parallel sizes the model splits at, the context-parallel sizes its sequences split at
// and, at c > 1, the exchanges asked; each profiled (launcher/planning/profiler.h, measured here)
// or traced on meta tensors for a catalog device (launcher/planning/trace_profile.h).

#include "launcher/data/dataset.h"
#include "launcher/planning/job_plan.h"
#include "launcher/planning/profiler.h"
#include "launcher/planning/trace_profile.h"
#include "planner/layout_search.h"

#include <vector>

namespace ht {

// What profile_splits needs besides the job: how to profile, and the ranks planned.
struct SplitRequest {
  const ProfileRequest& request;
  const TraceRequest& trace;
  int most = 1, fewest = 1;  // ranks planned
  bool sequence_parallel = true;
};

// Every split of a replica's ranks to search (t x c and, at c > 1, each exchange asked), each
// profiled into `profiles`: the caller's profile where it has one (args.profiles), else traced or
// measured here. `machine` is the one planned for (a node's devices bound the automatic sizes).
std::vector<RankSplit> profile_splits(const Config& config, const Dataset* train, const DataInfo& info,
                                      const PlanArgs& args, const SplitRequest& r, const Machine& machine,
                                      SplitProfiles& profiles);

}  // namespace ht

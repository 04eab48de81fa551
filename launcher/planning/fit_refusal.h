#pragma once
// The words of a run the planner predicts cannot fit (launcher/planning/run_check.h): what was
// predicted, the limit, and the fastest plans at these ranks that fit.

#include "launcher/config/config.h"
#include "base/user_error.h"
#include "planner/search.h"
#include "training/run_plan.h"

#include <string>
#include <vector>

namespace ht {

// `auto_words`: memory.policy = "auto"'s candidates and their predictions, none of which fits;
// empty otherwise.
UserError does_not_fit(const Config& c, const RunPlan& run, const Prediction& p, int64_t limit,
                       const std::vector<RankedPlan>& fitting, const std::string& auto_words);

}  // namespace ht

#pragma once
// hybrid_train plan CONFIG.toml [options] [--section.key=value ...]: profiles the job, prints
// what it measured, the ranked plans and why the winner wins, and writes the winner as
// <job.output_dir>/plan.toml, a config that trains as is.

#include "launcher/config/config.h"
#include "launcher/planning/job_plan.h"

namespace ht {

struct PlanCommand {
  PlanArgs args;
  bool all_rows = false;  // print every plan, not the first 15
};

// Returns the exit status. Throws UserError for input found wrong (nothing written then).
int run_plan_command(const Config& config, const PlanCommand& command);

}  // namespace ht

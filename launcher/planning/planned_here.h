#pragma once
// Where a training run's own prediction comes from (launcher/planning/run_check.h): on CPU ranks a
// profile of its model on this machine, never a trace priced at a catalog device's rates
// ([cluster].device is what `plan` plans a cluster with); on a GPU (issue 67) a trace priced at
// the local GPU's catalog kind, or its kind measured at start where the catalog lacks it.

#include "launcher/config/config.h"
#include "parallel/process_grid.h"
#include "training/run_plan.h"

#include <optional>
#include <string>

namespace ht {

// The config with no [cluster].device: profiled here.
Config profiled_here(const Config& config);

// The config the run is planned with: profiled_here on CPU ranks; on a GPU, [cluster] set to this
// node's ranks as one node of the catalog kind of this rank's GPU (run.device), with the memory the
// driver has free and the runtime's share added back (the planner counts it apart). A GPU the
// catalog lacks is measured (measured_gpu_kind); empty where that fails, `why` then saying so.
std::optional<Config> planned_here(const Config& config, const RunPlan& run, const ProcessGrid& grid, std::string& why);

}  // namespace ht

#pragma once
// The planner's printed report: what it measured, the ranked table of plans, and the winner.

#include "planner/machine.h"
#include "planner/op_time.h"
#include "planner/profile.h"
#include "planner/profile_at.h"
#include "planner/search.h"

#include <map>
#include <string>
#include <vector>

namespace ht {

// Bytes an op call holds while it runs: what it reads plus what it allocates, at the most (the
// smallest budget any plan could run that op in, beside what must stay).
int64_t largest_op_working_set(const StepTrace& trace);

// A traced step's kernel time by op ("linear", "linear backward"), as shares of the whole (summing
// to 1; empty for a trace without timed kernels): what `time by op` prints, and what plans.jsonl
// splits a plan's predicted compute by (scripts/compare_plan_run.py sets it beside a run's).
std::map<std::string, double> time_shares_by_op(const StepTrace& trace);
// The same of kernel_times(profile, micro-batch, precision) (planner/profile_at.h), without a trace.
std::map<std::string, double> time_shares_by_op(const std::vector<KernelTime>& kernels);

// Of a traced step's kernel time priced at `rates`, the share in misaligned 16-bit products
// (a dimension not a multiple of 8), and the share they would save aligned.
struct MisalignedTime {
  double share = 0;
  double saved_share = 0;
};
MisalignedTime misaligned_time(const StepTrace& trace, const DeviceRates& rates);

std::string profile_text(const ModelProfile& profile, const Machine& machine);
// The first `rows` plans (every fitting one ranked first), one line each; a language model's
// (`tokens`) in tokens a second and device-hours per billion tokens, others' in samples and epochs.
std::string plans_table(const std::vector<RankedPlan>& ranked, size_t rows, bool tokens = false);

}  // namespace ht

#pragma once
// Host swap in a prediction (memory.policy = "swap" or "hybrid"; memory/host_swap.h), from the
// profiled step's trace, as the runtime's rules choose:
// - swap (vDNN): every value backward reads that a convolution or a matmul made or reads, of
//   64 KiB or more, with a producer that can run again, is copied out in forward;
// - hybrid (Capuchin): such values of any op, in the order forward makes them, as long as the
//   link (one copy at a time, bytes / host_link_gbps each) finishes them before forward ends.
// Copies out run beside forward, copies back beside backward; what the link needs beyond that
// compute is time the step waits. A value comes back only if it was dropped, so with a budget
// DTR's replay never has to evict from, nothing comes back.
// Not modelled: hybrid's copy of a DTR victim in place of its recomputation (it depends on the
// eviction order), copies made again after a cancelled prefetch, and waits for a copy out to
// free memory; the measured run reports all three (swap_in_bytes, swap_wait_ms).

#include "planner/plan.h"
#include "planner/profile_at.h"
#include "planner/machine.h"
#include "planner/step_trace.h"

namespace ht {

// Fills p.swap_* for one micro-batch's `trace` (its kernel times scaled by `slowdown`), times
// `accumulation`; `evicts`: the budget makes DTR's replay evict (so copied values are dropped
// and come back).
void swap_terms(const StepTrace& trace, MemoryPolicy policy, const Machine& machine, double slowdown,
                bool evicts, int64_t accumulation, Prediction& p);

}  // namespace ht

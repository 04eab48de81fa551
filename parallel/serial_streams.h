#pragma once
// A pipeline's messages played on serial streams, as NCCL runs them (issue 67): each rank's
// stream (parallel/pipeline_links.h: rank_stream) runs its items one after another; a group of
// sends and receives holds the stream until every call in it has met its match, and a link's
// messages match in posting order. Played without time, it says whether a posting runs at all
// (a stage checks that before it posts anything); played in time, how long a step takes where
// sends wait for their receives, which the planner prices on GPUs (planner/pipeline_terms.h).

#include "parallel/pipeline_links.h"
#include "parallel/pipeline_schedule.h"

#include <optional>
#include <string>

namespace ht {

// "" where every rank's stream runs to its end under `posting`; else the first deadlock: each
// rank's stream is stuck, and the message names what the first rank waits for. A link whose
// orders part (check_link_order) is reported as such. `lookahead` (kAhead) is at least 1.
std::string check_on_serial_streams(const PipelineSchedule& schedule, ScheduleShape shape, Posting posting,
                                    size_t lookahead = kReceiveLookahead);

// What a stage on NCCL posts by, chosen before it posts anything: of kGrouped, kDeferred and
// kPairs, the one whose streams end soonest played in time (simulate_on_serial_streams) with
// actions of equal cost and messages a tenth of one, the first of them on a tie; none where every
// one deadlocks. The planner prices the same choice. ZB-H1 takes kDeferred: grouped, its sender
// waits in a lone send for a receiver busy with its own work, and the weight halves that should
// fill the bubble wait behind it.
std::optional<Posting> serial_posting(const PipelineSchedule& schedule, ScheduleShape shape);

// The streams played in time: an action runs for action_cost from when its stream reaches it; a
// group is posted when its stream reaches it; each send meets its receive costs.p2p after the
// later of the two groups was posted (a send, like a receive, waits for its peer: NCCL's, and
// the NCCL-like links' synchronous sends); the stream goes on when the last call of the group has
// met its match. Nothing else orders the actions: a receive before an action is what it needs.
// Against simulate() (sends that never block, receives matched by tag) the difference is what
// posting in order costs: a rank whose group holds a send its peer will receive only after its
// own work waits that long. `deadlock` and `error` as check_on_serial_streams finds them.
SimulationResult simulate_on_serial_streams(const PipelineSchedule& schedule, ScheduleShape shape, Posting posting,
                                            const SimulationCosts& costs = {}, size_t lookahead = kReceiveLookahead);

}  // namespace ht

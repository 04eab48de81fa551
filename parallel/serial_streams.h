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
#include <vector>

namespace ht {

// "" where every rank's stream runs to its end under `posting`; else the first deadlock: each
// rank's stream is stuck, and the message names what the first rank waits for. A link whose
// orders part (check_link_order) is reported as such. `lookahead` (kAhead) is at least 1.
std::string check_on_serial_streams(const PipelineSchedule& schedule, ScheduleShape shape, Posting posting,
                                    size_t lookahead = kReceiveLookahead);

// What a stage on NCCL posts by, chosen before it posts anything: of kGrouped, kDeferred and
// kPairs, the one whose streams end soonest played in time (SerialStreams::play) with actions of
// equal cost and messages a tenth of one, the first of them on a tie; none where every one
// deadlocks. The planner prices the same choice. ZB-H1 with more micro-batches than stages takes
// kDeferred: grouped, its sender waits in a lone send for a receiver busy with its own work, and
// the weight halves that should fill the bubble wait behind it.
std::optional<Posting> serial_posting(const PipelineSchedule& schedule, ScheduleShape shape);

// A schedule's streams under a posting, built once (the items, the groups' calls, the links'
// order checked) and played in time with any costs: what the planner prices each candidate plan
// with. play(): an action runs for action_cost from when its stream reaches it; a group is posted
// when its stream reaches it; each send meets its receive costs.p2p after the later of the two
// groups was posted (a send, like a receive, waits for its peer: as this project's post_group
// holds its stream until the whole group is done, and the NCCL-like links' synchronous sends; real
// NCCL may let a small send finish before its receive is posted); the stream goes on when the
// last call of the group has met its match. Nothing else orders the actions: a receive before an
// action is what it needs. Against simulate() (sends that never block, receives matched by tag)
// the difference is what posting in order costs. `deadlock` and `error` as check_on_serial_streams
// finds them.
class SerialStreams {
 public:
  SerialStreams(const PipelineSchedule& schedule, ScheduleShape shape, Posting posting,
                size_t lookahead = kReceiveLookahead);
  // `starts`: fill SimulationResult::start (the planner reads only the makespan and busy times).
  SimulationResult play(const SimulationCosts& costs = {}, bool starts = true) const;
  Posting posting() const { return posting_; }

  // One call of a group; one item of a rank's stream: an action (action >= 0), or the group of
  // calls [first_call, first_call + calls).
  struct Call {
    PostedMessage op;
  };
  struct Entry {
    int action = -1;
    size_t first_call = 0, calls = 0;
  };

 private:
  PipelineSchedule schedule_;
  ScheduleShape shape_;
  Posting posting_;
  std::string order_error_;          // the links' orders part: every play reports it
  std::vector<Entry> entries_;       // every rank's items, rank by rank
  std::vector<size_t> first_entry_;  // per rank, and the end after the last rank
  std::vector<Call> calls_;          // as posted (a play keeps their matches apart)
};

// SerialStreams(schedule, shape, posting, lookahead).play(costs).
SimulationResult simulate_on_serial_streams(const PipelineSchedule& schedule, ScheduleShape shape, Posting posting,
                                            const SimulationCosts& costs = {}, size_t lookahead = kReceiveLookahead);

}  // namespace ht

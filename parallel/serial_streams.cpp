#include "parallel/serial_streams.h"

#include <algorithm>
#include <cstdint>
#include <deque>

namespace ht {
namespace {

using Call = SerialStreams::Call;
using Entry = SerialStreams::Entry;

// A play's state: each rank's head (an index into the entries) and clock (when its stream
// reached its head), the calls' matches.
struct PlayState {
  const std::vector<Entry>& entries;
  const std::vector<Call>& calls;
  std::vector<uint8_t> matched;  // per call
  std::vector<double> done;      // per call: when its message arrived
  std::vector<size_t> head, end;
  std::vector<double> clock;
};

// Matches, at the head of rank `r`'s stream, every send whose receive is at the head of its
// peer's, the pair completing p2p after the later of the two posts; each peer whose receive was
// matched is handed to `wake`.
template <typename Wake>
void match_sends(PlayState& s, size_t r, double p2p, Wake&& wake) {
  const Entry& mine = s.entries[s.head[r]];
  for (size_t i = mine.first_call; i < mine.first_call + mine.calls; ++i) {
    const PostedMessage& send = s.calls[i].op;
    if (!send.send || s.matched[i]) continue;
    const auto q = static_cast<size_t>(send.peer);
    if (s.head[q] >= s.end[q]) continue;
    const Entry& theirs = s.entries[s.head[q]];
    for (size_t j = theirs.first_call; j < theirs.first_call + theirs.calls; ++j) {
      const PostedMessage& receive = s.calls[j].op;
      // The peer's first unmatched receive from r in its running group: NCCL's posting order.
      if (receive.send || s.matched[j] || receive.peer != static_cast<int>(r)) continue;
      if (receive.message == send.message) {
        s.matched[i] = s.matched[j] = 1;
        s.done[i] = s.done[j] = std::max(s.clock[r], s.clock[q]) + p2p;
        wake(q);
      }
      break;
    }
  }
}

std::string stuck_at(const PlayState& s) {
  for (size_t r = 0; r < s.head.size(); ++r) {
    if (s.head[r] >= s.end[r]) continue;
    const Entry& e = s.entries[s.head[r]];
    for (size_t i = e.first_call; i < e.first_call + e.calls; ++i) {
      if (s.matched[i]) continue;
      const PostedMessage& op = s.calls[i].op;
      return "deadlock on serial streams: rank " + std::to_string(r) + (op.send ? " sends " : " receives ") +
             describe(op.message) + (op.send ? " to rank " : " from rank ") + std::to_string(op.peer) +
             ", which is blocked on an earlier call of its own";
    }
  }
  return "deadlock on serial streams";
}

}  // namespace

SerialStreams::SerialStreams(const PipelineSchedule& schedule, ScheduleShape shape, Posting posting, size_t lookahead)
    : schedule_(schedule), shape_(shape), posting_(posting) {
  if (static_cast<int>(schedule.size()) != shape.stages) {
    order_error_ = "the schedule has " + std::to_string(schedule.size()) + " ranks for " +
                   std::to_string(shape.stages) + " stages";
    return;
  }
  order_error_ = check_link_order(schedule, shape);
  if (!order_error_.empty()) return;
  for (size_t r = 0; r < schedule.size(); ++r) {
    first_entry_.push_back(entries_.size());
    for (const StreamItem& item : rank_stream(schedule[r], static_cast<int>(r), shape, posting, lookahead)) {
      entries_.push_back({item.action, calls_.size(), item.group.size()});
      for (const PostedMessage& op : item.group) calls_.push_back({op});
    }
  }
  first_entry_.push_back(entries_.size());
}

// Runs every stream as far as it can until none can move. A worklist of ranks: a rank is looked
// at again when a peer arrives at a group that receives from it (its sends may match now) or
// matches one of its receives, so each item and call is handled a bounded number of times.
SimulationResult SerialStreams::play(const SimulationCosts& costs, bool starts) const {
  SimulationResult res;
  if (!order_error_.empty()) {
    res.deadlock = static_cast<int>(schedule_.size()) == shape_.stages;  // a malformed schedule is no deadlock
    res.error = order_error_;
    return res;
  }
  const size_t ranks = schedule_.size();
  res.busy.assign(ranks, 0);
  for (const auto& list : schedule_) {
    if (starts) res.start.emplace_back(list.size(), -1);
    res.peak_in_flight.push_back(peak_in_flight(list));
  }
  PlayState s{entries_, calls_, std::vector<uint8_t>(calls_.size(), 0), std::vector<double>(calls_.size(), 0),
              {}, {}, std::vector<double>(ranks, 0)};
  s.head.assign(first_entry_.begin(), first_entry_.end() - 1);
  s.end.assign(first_entry_.begin() + 1, first_entry_.end());
  std::deque<size_t> work;
  std::vector<bool> queued(ranks, true);
  std::vector<size_t> arrived(ranks, SIZE_MAX);  // the group each rank last arrived at
  for (size_t r = 0; r < ranks; ++r) work.push_back(r);
  const auto wake = [&](size_t q) {
    if (!queued[q]) work.push_back(q);
    queued[q] = true;
  };
  while (!work.empty()) {
    const size_t r = work.front();
    work.pop_front();
    queued[r] = false;
    for (; s.head[r] < s.end[r]; ++s.head[r]) {
      const Entry& item = entries_[s.head[r]];
      if (item.action >= 0) {
        const auto a = static_cast<size_t>(item.action);
        const double cost = action_cost(schedule_[r][a], static_cast<int>(r), costs);
        if (starts) res.start[r][a] = s.clock[r];
        res.busy[r] += cost;
        s.clock[r] += cost;
        continue;
      }
      const size_t first = item.first_call, last = item.first_call + item.calls;
      if (arrived[r] != s.head[r]) {  // new here: the senders of its receives may match them now
        arrived[r] = s.head[r];
        for (size_t c = first; c < last; ++c) {
          if (!calls_[c].op.send && !s.matched[c]) wake(static_cast<size_t>(calls_[c].op.peer));
        }
      }
      match_sends(s, r, costs.p2p, wake);
      bool all = true;
      for (size_t c = first; c < last && all; ++c) all = s.matched[c] != 0;
      if (!all) break;
      for (size_t c = first; c < last; ++c) s.clock[r] = std::max(s.clock[r], s.done[c]);
    }
  }
  for (size_t r = 0; r < ranks && res.error.empty(); ++r) {
    if (s.head[r] < s.end[r]) res.error = stuck_at(s);
  }
  res.deadlock = !res.error.empty();
  res.makespan = s.clock.empty() ? 0 : *std::max_element(s.clock.begin(), s.clock.end());
  double busy = 0;
  for (double b : res.busy) busy += b;
  if (res.makespan > 0) res.bubble = 1 - busy / (static_cast<double>(ranks) * res.makespan);
  return res;
}

SimulationResult simulate_on_serial_streams(const PipelineSchedule& schedule, ScheduleShape shape, Posting posting,
                                            const SimulationCosts& costs, size_t lookahead) {
  return SerialStreams(schedule, shape, posting, lookahead).play(costs);
}

std::string check_on_serial_streams(const PipelineSchedule& schedule, ScheduleShape shape, Posting posting,
                                    size_t lookahead) {
  return simulate_on_serial_streams(schedule, shape, posting, {}, lookahead).error;
}

std::optional<Posting> serial_posting(const PipelineSchedule& schedule, ScheduleShape shape) {
  SimulationCosts uniform;
  uniform.p2p = 0.1;
  std::optional<Posting> best;
  double soonest = 0;
  for (Posting p : {Posting::kGrouped, Posting::kDeferred, Posting::kPairs}) {
    const SimulationResult played = simulate_on_serial_streams(schedule, shape, p, uniform);
    if (!played.error.empty()) continue;
    if (!best || played.makespan < soonest - 1e-9) {
      best = p;
      soonest = played.makespan;
    }
  }
  return best;
}

}  // namespace ht

#include "parallel/serial_streams.h"

#include <algorithm>

namespace ht {
namespace {

// A call of a group as the streams play it: matched, and when its message arrived.
struct Call {
  PostedMessage op;
  bool matched = false;
  double done = 0;
};
// A stream item: an action (action >= 0) or a group of calls that complete together.
struct Item {
  int action = -1;
  std::vector<Call> group;
};

struct Streams {
  std::vector<std::vector<Item>> items;  // per rank
  std::vector<size_t> head;              // per rank: the item its stream is at
  std::vector<double> clock;             // per rank: when its stream reached its head item
};

Streams streams_of(const PipelineSchedule& schedule, ScheduleShape shape, Posting posting, size_t lookahead) {
  Streams s;
  for (size_t r = 0; r < schedule.size(); ++r) {
    std::vector<Item> items;
    for (const StreamItem& si : rank_stream(schedule[r], static_cast<int>(r), shape, posting, lookahead)) {
      Item item{si.action, {}};
      for (const PostedMessage& op : si.group) item.group.push_back({op, false, 0});
      items.push_back(std::move(item));
    }
    s.items.push_back(std::move(items));
  }
  s.head.assign(s.items.size(), 0);
  s.clock.assign(s.items.size(), 0);
  return s;
}

// Matches, at the head of rank `r`'s stream, every send whose receive is at the head of its
// peer's; true where anything moved. The pair completes p2p after the later of the two posts.
bool match_sends(Streams& s, int r, double p2p) {
  bool moved = false;
  const auto ru = static_cast<size_t>(r);
  for (Call& send : s.items[ru][s.head[ru]].group) {
    if (!send.op.send || send.matched) continue;
    const auto q = static_cast<size_t>(send.op.peer);
    if (s.head[q] >= s.items[q].size()) continue;
    for (Call& receive : s.items[q][s.head[q]].group) {
      // The peer's first unmatched receive from r in its running group: NCCL's posting order.
      if (receive.op.send || receive.matched || receive.op.peer != r) continue;
      if (receive.op.message == send.op.message) {
        receive.matched = send.matched = moved = true;
        receive.done = send.done = std::max(s.clock[ru], s.clock[q]) + p2p;
      }
      break;
    }
  }
  return moved;
}

std::string stuck_at(const Streams& s) {
  for (size_t r = 0; r < s.items.size(); ++r) {
    if (s.head[r] >= s.items[r].size()) continue;
    for (const Call& c : s.items[r][s.head[r]].group) {
      if (c.matched) continue;
      const PostedMessage& op = c.op;
      return "deadlock on serial streams: rank " + std::to_string(r) + (op.send ? " sends " : " receives ") +
             describe(op.message) + (op.send ? " to rank " : " from rank ") + std::to_string(op.peer) +
             ", which is blocked on an earlier call of its own";
    }
  }
  return "deadlock on serial streams";
}

// Runs every stream as far as it can until none moves; "" when all reached their ends.
std::string play(const PipelineSchedule& schedule, Streams& s, const SimulationCosts& costs, SimulationResult& res) {
  for (bool moved = true; moved;) {
    moved = false;
    for (size_t r = 0; r < s.items.size(); ++r) {
      while (s.head[r] < s.items[r].size()) {
        Item& item = s.items[r][s.head[r]];
        if (item.action >= 0) {
          const auto a = static_cast<size_t>(item.action);
          const double cost = action_cost(schedule[r][a], static_cast<int>(r), costs);
          res.start[r][a] = s.clock[r];
          res.busy[r] += cost;
          s.clock[r] += cost;
        } else {
          moved = match_sends(s, static_cast<int>(r), costs.p2p) || moved;
          if (!std::all_of(item.group.begin(), item.group.end(), [](const Call& c) { return c.matched; })) break;
          for (const Call& c : item.group) s.clock[r] = std::max(s.clock[r], c.done);
        }
        ++s.head[r];
        moved = true;
      }
    }
  }
  for (size_t r = 0; r < s.items.size(); ++r) {
    if (s.head[r] < s.items[r].size()) return stuck_at(s);
  }
  return "";
}

}  // namespace

SimulationResult simulate_on_serial_streams(const PipelineSchedule& schedule, ScheduleShape shape, Posting posting,
                                            const SimulationCosts& costs, size_t lookahead) {
  SimulationResult res;
  if (static_cast<int>(schedule.size()) != shape.stages) {
    res.error = "the schedule has " + std::to_string(schedule.size()) + " ranks for " + std::to_string(shape.stages) +
                " stages";
    return res;
  }
  if (std::string order = check_link_order(schedule, shape); !order.empty()) {
    res.deadlock = true;
    res.error = order;
    return res;
  }
  res.busy.assign(schedule.size(), 0);
  for (const auto& list : schedule) {
    res.start.emplace_back(list.size(), -1);
    res.peak_in_flight.push_back(peak_in_flight(list));
  }
  Streams s = streams_of(schedule, shape, posting, lookahead);
  res.error = play(schedule, s, costs, res);
  res.deadlock = !res.error.empty();
  res.makespan = s.clock.empty() ? 0 : *std::max_element(s.clock.begin(), s.clock.end());
  double busy = 0;
  for (double b : res.busy) busy += b;
  if (res.makespan > 0) res.bubble = 1 - busy / (static_cast<double>(schedule.size()) * res.makespan);
  return res;
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
    if (played.deadlock || !played.error.empty()) continue;
    if (!best || played.makespan < soonest - 1e-9) {
      best = p;
      soonest = played.makespan;
    }
  }
  return best;
}

}  // namespace ht

#include "parallel/pipeline_links.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

namespace ht {

bool operator==(const LinkMessage& a, const LinkMessage& b) {
  return a.micro_batch == b.micro_batch && a.to_vs == b.to_vs && a.gradient == b.gradient;
}

bool operator<(const LinkMessage& a, const LinkMessage& b) {
  return std::tie(a.micro_batch, a.to_vs, a.gradient) < std::tie(b.micro_batch, b.to_vs, b.gradient);
}

std::string describe(const LinkMessage& m) {
  return std::string(m.gradient ? "the gradient" : "the activation") + " for virtual stage " + std::to_string(m.to_vs) +
         " of micro-batch " + std::to_string(m.micro_batch);
}

std::string describe(Posting posting) {
  switch (posting) {
    case Posting::kAhead: return "matched by tag, receives posted " + std::to_string(kReceiveLookahead) + " actions ahead";
    case Posting::kGrouped: return "matched in posting order, each action's sends grouped with the next one's receives";
    case Posting::kPairs:
      return "matched in posting order, a forward and the backward after it as one unit, its sends grouped with the "
             "next unit's receives";
  }
  return "";
}

namespace {

bool sends_gradient(ActionKind k) { return k == ActionKind::kBackward || k == ActionKind::kBackwardInput; }

}  // namespace

ActionMessages messages_of(const Action& a, int r, ScheduleShape shape) {
  ActionMessages m;
  const int vs = virtual_stage(r, a.chunk, shape), last = shape.stages * shape.virtual_stages - 1;
  if (a.kind == ActionKind::kForward) {
    if (vs > 0 && rank_of_virtual_stage(vs - 1, shape) != r) {
      m.receive.push_back({false, rank_of_virtual_stage(vs - 1, shape), {a.micro_batch, vs, false}});
    }
    if (vs < last && rank_of_virtual_stage(vs + 1, shape) != r) {
      m.send.push_back({true, rank_of_virtual_stage(vs + 1, shape), {a.micro_batch, vs + 1, false}});
    }
  } else if (sends_gradient(a.kind)) {
    if (vs < last && rank_of_virtual_stage(vs + 1, shape) != r) {
      m.receive.push_back({false, rank_of_virtual_stage(vs + 1, shape), {a.micro_batch, vs, true}});
    }
    if (vs > 0 && rank_of_virtual_stage(vs - 1, shape) != r) {
      m.send.push_back({true, rank_of_virtual_stage(vs - 1, shape), {a.micro_batch, vs - 1, true}});
    }
  }
  return m;
}

std::vector<LinkOrder> link_orders(const PipelineSchedule& schedule, ScheduleShape shape) {
  std::map<std::pair<int, int>, LinkOrder> links;
  const auto link = [&](int from, int to) -> LinkOrder& {
    LinkOrder& l = links[{from, to}];
    l.from = from;
    l.to = to;
    return l;
  };
  for (int r = 0; r < static_cast<int>(schedule.size()); ++r) {
    for (const Action& a : schedule[static_cast<size_t>(r)]) {
      const ActionMessages m = messages_of(a, r, shape);
      for (const PostedMessage& op : m.receive) link(op.peer, r).received.push_back(op.message);
      for (const PostedMessage& op : m.send) link(r, op.peer).sent.push_back(op.message);
    }
  }
  std::vector<LinkOrder> out;
  for (auto& [key, l] : links) out.push_back(std::move(l));
  return out;
}

std::string check_link_order(const PipelineSchedule& schedule, ScheduleShape shape) {
  for (const LinkOrder& l : link_orders(schedule, shape)) {
    const std::string name = "link " + std::to_string(l.from) + " -> " + std::to_string(l.to);
    const size_t n = std::min(l.sent.size(), l.received.size());
    for (size_t i = 0; i < n; ++i) {
      if (l.sent[i] == l.received[i]) continue;
      return name + ": message " + std::to_string(i + 1) + " sent is " + describe(l.sent[i]) +
             ", but the receive posted " + std::to_string(i + 1) + " is for " + describe(l.received[i]);
    }
    if (l.sent.size() != l.received.size()) {
      return name + ": " + std::to_string(l.sent.size()) + " messages sent, " + std::to_string(l.received.size()) +
             " receives posted";
    }
  }
  return "";
}

std::vector<StreamItem> rank_stream(const std::vector<Action>& actions, int r, ScheduleShape shape, Posting posting,
                                    size_t lookahead) {
  lookahead = std::max<size_t>(lookahead, 1);  // an action's receive is posted by the action at the latest
  std::vector<ActionMessages> m;
  for (const Action& a : actions) m.push_back(messages_of(a, r, shape));
  std::vector<StreamItem> items;
  const auto alone = [&](const std::vector<PostedMessage>& ops) {
    for (const PostedMessage& op : ops) items.push_back({-1, {op}});
  };
  const auto run = [&](size_t i) { items.push_back({static_cast<int>(i), {}}); };
  if (posting == Posting::kAhead) {
    size_t posted = 0;
    for (size_t i = 0; i < actions.size(); ++i) {
      for (; posted < std::min(actions.size(), i + lookahead); ++posted) alone(m[posted].receive);
      run(i);
      alone(m[i].send);
    }
    return items;
  }
  // Units: a forward followed by a backward is one (1F1B's steady state), any other action one of
  // its own. Before each unit, one group of the previous unit's sends and this unit's receives.
  std::vector<std::pair<size_t, size_t>> units;  // [begin, end)
  for (size_t i = 0; i < actions.size();) {
    const bool pair = posting == Posting::kPairs && i + 1 < actions.size() && actions[i].kind == ActionKind::kForward &&
                      actions[i + 1].kind != ActionKind::kForward;
    units.push_back({i, i + (pair ? 2 : 1)});
    i += pair ? 2 : 1;
  }
  for (size_t u = 0; u <= units.size(); ++u) {
    StreamItem group;
    if (u > 0) {
      for (size_t j = units[u - 1].first; j < units[u - 1].second; ++j) {
        group.group.insert(group.group.end(), m[j].send.begin(), m[j].send.end());
      }
    }
    if (u < units.size()) {
      for (size_t j = units[u].first; j < units[u].second; ++j) {
        group.group.insert(group.group.end(), m[j].receive.begin(), m[j].receive.end());
      }
    }
    if (!group.group.empty()) items.push_back(std::move(group));
    if (u < units.size()) {
      for (size_t j = units[u].first; j < units[u].second; ++j) run(j);
    }
  }
  return items;
}

namespace {

// A stream item as the serial streams play it: a compute (no messages) or a group whose sends and
// receives complete together.
struct P2p {
  PostedMessage op;
  bool matched = false;
};
struct Item {
  std::vector<P2p> group;
};

std::vector<Item> stream_of(const std::vector<Action>& actions, int r, ScheduleShape shape, Posting posting,
                            size_t lookahead) {
  std::vector<Item> items;
  for (const StreamItem& s : rank_stream(actions, r, shape, posting, lookahead)) {
    Item item;
    for (const PostedMessage& op : s.group) item.group.push_back({op, false});
    items.push_back(std::move(item));
  }
  return items;
}

// Matches, at the head of rank `r`'s stream, every send whose receive is at the head of its peer's;
// true where anything moved.
bool match_sends(std::vector<std::vector<Item>>& streams, std::vector<size_t>& head, int r) {
  bool moved = false;
  for (P2p& send : streams[static_cast<size_t>(r)][head[static_cast<size_t>(r)]].group) {
    if (!send.op.send || send.matched) continue;
    const size_t q = static_cast<size_t>(send.op.peer);
    if (head[q] >= streams[q].size()) continue;
    for (P2p& receive : streams[q][head[q]].group) {
      // The peer's first unmatched receive from r in its running group: NCCL's posting order.
      if (receive.op.send || receive.matched || receive.op.peer != r) continue;
      if (receive.op.message == send.op.message) receive.matched = send.matched = moved = true;
      break;
    }
  }
  return moved;
}

std::string stuck_at(const std::vector<std::vector<Item>>& streams, const std::vector<size_t>& head) {
  for (size_t r = 0; r < streams.size(); ++r) {
    if (head[r] >= streams[r].size()) continue;
    for (const P2p& p : streams[r][head[r]].group) {
      if (p.matched) continue;
      const PostedMessage& op = p.op;
      return "deadlock on serial streams: rank " + std::to_string(r) + (op.send ? " sends " : " receives ") +
             describe(op.message) + (op.send ? " to rank " : " from rank ") + std::to_string(op.peer) +
             ", which is blocked on an earlier call of its own";
    }
  }
  return "deadlock on serial streams";
}

}  // namespace

std::string check_on_serial_streams(const PipelineSchedule& schedule, ScheduleShape shape, Posting posting,
                                    size_t lookahead) {
  if (std::string order = check_link_order(schedule, shape); !order.empty()) return order;
  std::vector<std::vector<Item>> streams;
  for (size_t r = 0; r < schedule.size(); ++r) {
    streams.push_back(stream_of(schedule[r], static_cast<int>(r), shape, posting, lookahead));
  }
  std::vector<size_t> head(streams.size(), 0);
  for (bool moved = true; moved;) {
    moved = false;
    for (size_t r = 0; r < streams.size(); ++r) {
      while (head[r] < streams[r].size()) {
        moved = match_sends(streams, head, static_cast<int>(r)) || moved;
        const auto& group = streams[r][head[r]].group;
        if (!std::all_of(group.begin(), group.end(), [](const P2p& op) { return op.matched; })) break;
        ++head[r];
        moved = true;
      }
    }
  }
  for (size_t r = 0; r < streams.size(); ++r) {
    if (head[r] < streams[r].size()) return stuck_at(streams, head);
  }
  return "";
}

std::optional<Posting> posting_that_runs(const PipelineSchedule& schedule, ScheduleShape shape) {
  for (Posting p : {Posting::kGrouped, Posting::kPairs}) {
    if (check_on_serial_streams(schedule, shape, p).empty()) return p;
  }
  return std::nullopt;
}

}  // namespace ht

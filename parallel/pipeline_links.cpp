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
    case Posting::kDeferred:
      return "matched in posting order, each action's sends grouped with the receives of the next action that has "
             "a message";
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
  // its own. Before each unit, one group of the sends not yet posted and this unit's receives;
  // kDeferred posts none before a unit that sends and receives nothing while a later unit has a
  // message (the sends go with that unit's group; after the last such unit, at once).
  std::vector<std::pair<size_t, size_t>> units;  // [begin, end)
  for (size_t i = 0; i < actions.size();) {
    const bool pair = posting == Posting::kPairs && i + 1 < actions.size() && actions[i].kind == ActionKind::kForward &&
                      actions[i + 1].kind != ActionKind::kForward;
    units.push_back({i, i + (pair ? 2 : 1)});
    i += pair ? 2 : 1;
  }
  const auto silent = [&](std::pair<size_t, size_t> unit) {
    for (size_t j = unit.first; j < unit.second; ++j) {
      if (!m[j].send.empty() || !m[j].receive.empty()) return false;
    }
    return true;
  };
  // The last unit with a message: past it no group comes to carry a deferred send.
  size_t last_loud = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    if (!silent(units[u])) last_loud = u;
  }
  std::vector<PostedMessage> pending;  // sends not yet posted
  for (size_t u = 0; u <= units.size(); ++u) {
    if (u > 0) {
      for (size_t j = units[u - 1].first; j < units[u - 1].second; ++j) {
        pending.insert(pending.end(), m[j].send.begin(), m[j].send.end());
      }
    }
    const bool defer = posting == Posting::kDeferred && u < last_loud && silent(units[u]);
    if (!defer) {
      StreamItem group;
      group.group = std::move(pending);
      pending.clear();
      if (u < units.size()) {
        for (size_t j = units[u].first; j < units[u].second; ++j) {
          group.group.insert(group.group.end(), m[j].receive.begin(), m[j].receive.end());
        }
      }
      if (!group.group.empty()) items.push_back(std::move(group));
    }
    if (u < units.size()) {
      for (size_t j = units[u].first; j < units[u].second; ++j) run(j);
    }
  }
  return items;
}

}  // namespace ht

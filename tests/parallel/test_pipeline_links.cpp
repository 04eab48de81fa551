// The order of each link's messages under every schedule, and whether the ranks' posting runs on
// NCCL-like serial streams (parallel/pipeline_links.h): what NCCL, which matches a link's messages
// in posting order and holds a stream until a send or receive meets its match, needs of a schedule.
#include "parallel/pipeline_links.h"
#include "parallel/serial_streams.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace ht::test {
namespace {

struct Case {
  ScheduleKind kind;
  ScheduleShape shape;
};

std::string name(const Case& c) {
  return std::string(choice_name(c.kind)) + " p" + std::to_string(c.shape.stages) + " m" +
         std::to_string(c.shape.micro_batches) + " v" + std::to_string(c.shape.virtual_stages);
}

// Every schedule at 2-8 stages, micro-batches from one to more than three times the stages,
// interleaved with 2 and 3 chunks, where make_schedule takes the shape.
std::vector<Case> every_case() {
  std::vector<Case> out;
  for (ScheduleKind kind : {ScheduleKind::kGpipe, ScheduleKind::k1f1b, ScheduleKind::kInterleaved1f1b, ScheduleKind::kZbH1}) {
    for (int p = 2; p <= 8; ++p) {
      for (int m : {1, p - 1, p, p + 1, 2 * p, 3 * p + 1}) {
        for (int v : {1, 2, 3}) {
          if (m < 1 || (v > 1) != (kind == ScheduleKind::kInterleaved1f1b)) continue;
          const ScheduleShape shape{p, m, v};
          if (schedule_refusal(kind, shape).empty()) out.push_back({kind, shape});
        }
      }
    }
  }
  return out;
}

// Every schedule's links carry their messages in one order: each receiver posts its receives in
// the order its sender posts the sends, the interleaved schedule's wrap-around link (the last
// rank's chunk c to rank 0's chunk c + 1, and its gradients back) and ZB-H1's split backwards
// among them. So NCCL's matching by posting order hands every receive the right tensor.
TEST(PipelineLinks, EveryScheduleSendsEachLinksMessagesInTheOrderItsReceiverPostsThem) {
  const std::vector<Case> cases = every_case();
  EXPECT_GT(cases.size(), 150u);
  for (const Case& c : cases) {
    EXPECT_EQ(check_link_order(make_schedule(c.kind, c.shape), c.shape), "") << name(c);
  }
}

// Two stages under GPipe: the messages each link carries, as each side posts them.
TEST(PipelineLinks, AGpipeLinkCarriesActivationsOneWayAndGradientsTheOther) {
  const ScheduleShape shape{2, 2, 1};
  const std::vector<LinkOrder> links = link_orders(make_schedule(ScheduleKind::kGpipe, shape), shape);
  ASSERT_EQ(links.size(), 2u);
  EXPECT_EQ(links[0].from, 0);
  EXPECT_EQ(links[0].to, 1);
  const std::vector<LinkMessage> forward{{0, 1, false}, {1, 1, false}}, backward{{0, 0, true}, {1, 0, true}};
  EXPECT_EQ(links[0].sent, forward);
  EXPECT_EQ(links[0].received, forward);
  EXPECT_EQ(links[1].sent, backward);
  EXPECT_EQ(links[1].received, backward);
}

// A receive posted where its sender's turn has not come is caught, naming both messages.
TEST(PipelineLinks, ARankThatReadsItsMessagesOutOfOrderIsCaught) {
  const ScheduleShape shape{2, 2, 1};
  PipelineSchedule s = make_schedule(ScheduleKind::kGpipe, shape);
  std::swap(s[1][0], s[1][1]);  // rank 1 runs micro-batch 1's forward first
  const std::string why = check_link_order(s, shape);
  EXPECT_NE(why.find("link 0 -> 1: message 1 sent is the activation for virtual stage 1 of micro-batch 0"),
            std::string::npos)
      << why;
  EXPECT_NE(why.find("is for the activation for virtual stage 1 of micro-batch 1"), std::string::npos) << why;
}

// On NCCL a receive holds its rank's stream until its sender sends. A stage over MPI posts the
// receives of the next three actions ahead of the action that reads them (a latency win there,
// where irecv returns at once): on one serial stream rank 0's first receive, backward's gradient,
// waits ahead of its forward's send, which rank 1 waits for. Every schedule deadlocks so, which is
// why a stage on NCCL posts in groups (PipelineStage: Posting chosen by matches_by_tag()).
TEST(PipelineLinks, ReceivesPostedAheadDeadlockOnASerialStream) {
  for (const Case& c : every_case()) {
    const std::string why = check_on_serial_streams(make_schedule(c.kind, c.shape), c.shape, Posting::kAhead);
    EXPECT_NE(why.find("deadlock on serial streams: rank 0 receives"), std::string::npos) << name(c) << ": " << why;
  }
  // Posting nothing ahead (each receive alone just before its action) runs GPipe, whose ranks send
  // and receive in one direction at a time, but not 1F1B, whose steady state sends one way while
  // its peer sends the other: those pairs must be posted as one group.
  const ScheduleShape shape{4, 8, 1};
  EXPECT_EQ(check_on_serial_streams(make_schedule(ScheduleKind::kGpipe, shape), shape, Posting::kAhead, 1), "");
  EXPECT_NE(check_on_serial_streams(make_schedule(ScheduleKind::k1f1b, shape), shape, Posting::kAhead, 1), "");
}

// Megatron's batch_isend_irecv (each action's send grouped with the next action's receive) runs
// GPipe, 1F1B and ZB-H1 at every shape on serial streams, and the interleaved schedule where the
// micro-batches are one round of the stages. With more rounds it deadlocks: a rank's group waits
// for a message its peer posts only in a later group.
TEST(PipelineLinks, GroupedSendsAndReceivesRunEveryScheduleButInterleavedOverSeveralRounds) {
  for (const Case& c : every_case()) {
    const std::string why = check_on_serial_streams(make_schedule(c.kind, c.shape), c.shape, Posting::kGrouped);
    const bool rounds = c.kind == ScheduleKind::kInterleaved1f1b && c.shape.micro_batches > c.shape.stages;
    if (rounds) {
      EXPECT_NE(why.find("deadlock on serial streams"), std::string::npos) << name(c);
    } else {
      EXPECT_EQ(why, "") << name(c);
    }
  }
}

// Grouping a forward with the backward after it (Megatron's interleaved steady state) runs the
// interleaved schedule over several rounds, but not within one round, nor GPipe, whose last forward
// and first backward on rank 0 would wait on each other. Every schedule checked has a posting that
// runs, and a stage takes the one that ends soonest played in time: grouped for GPipe and 1F1B,
// pairs for the interleaved schedule over several rounds, sends deferred past the weight halves
// for ZB-H1 (grouped, a lone send holds the sender while its weight halves could run).
TEST(PipelineLinks, EveryScheduleHasAPostingThatRunsOnSerialStreamsAndAStageTakesTheSoonest) {
  SimulationCosts uniform;
  uniform.p2p = 0.1;
  for (const Case& c : every_case()) {
    const PipelineSchedule s = make_schedule(c.kind, c.shape);
    const std::optional<Posting> posting = serial_posting(s, c.shape);
    ASSERT_TRUE(posting.has_value()) << name(c);
    const double chosen = simulate_on_serial_streams(s, c.shape, *posting, uniform).makespan;
    for (Posting other : {Posting::kGrouped, Posting::kPairs, Posting::kDeferred}) {
      const SimulationResult played = simulate_on_serial_streams(s, c.shape, other, uniform);
      if (!played.deadlock) {
        EXPECT_LE(chosen, played.makespan + 1e-9) << name(c);
      }
    }
    const bool rounds = c.kind == ScheduleKind::kInterleaved1f1b && c.shape.micro_batches > c.shape.stages;
    if (rounds) {
      EXPECT_EQ(*posting, Posting::kPairs) << name(c);
    }
    if (c.kind == ScheduleKind::kGpipe || c.kind == ScheduleKind::k1f1b) {
      EXPECT_EQ(*posting, Posting::kGrouped) << name(c);
    }
  }
  const ScheduleShape gpipe{2, 2, 1};
  EXPECT_NE(check_on_serial_streams(make_schedule(ScheduleKind::kGpipe, gpipe), gpipe, Posting::kPairs), "");
  const ScheduleShape zb{4, 16, 1};
  const PipelineSchedule zb_h1 = make_schedule(ScheduleKind::kZbH1, zb);
  EXPECT_EQ(serial_posting(zb_h1, zb), Posting::kDeferred);
  EXPECT_LT(simulate_on_serial_streams(zb_h1, zb, Posting::kDeferred, uniform).makespan,
            simulate_on_serial_streams(zb_h1, zb, Posting::kGrouped, uniform).makespan);
}

// Deferred sends wait only while a later action of the stream has a message to go with; after
// the last one they are posted at once, not behind the trailing weight halves (which would keep
// every stage before waiting for its gradient).
TEST(PipelineLinks, DeferredSendsAreNotHeldPastTheLastActionWithAMessage) {
  for (const Case& c : every_case()) {
    const PipelineSchedule s = make_schedule(c.kind, c.shape);
    for (int r = 0; r < c.shape.stages; ++r) {
      const std::vector<Action>& actions = s[static_cast<size_t>(r)];
      const std::vector<StreamItem> stream = rank_stream(actions, r, c.shape, Posting::kDeferred);
      size_t last_loud = 0;
      for (size_t i = 0; i < stream.size(); ++i) {
        if (stream[i].action < 0) continue;
        const ActionMessages m = messages_of(actions[static_cast<size_t>(stream[i].action)], r, c.shape);
        if (!m.send.empty() || !m.receive.empty()) last_loud = i;
      }
      for (size_t i = last_loud + 2; i < stream.size(); ++i) {
        EXPECT_GE(stream[i].action, 0) << name(c) << " rank " << r << ": a group posted after trailing silent actions";
      }
    }
  }
}

// Played in time, by hand: 1F1B on 2 stages, 2 micro-batches, forward 1, backward 2, a message
// 0.5. A message moves only once both ends have posted: rank 1 posts its receive of micro-batch
// 1's activation with its gradient's send after its first backward (4.5), so the activation rank 0
// sent at 2.5 arrives at 5, where MPI's receive posted ahead had it at 3 and rank 1 ran it at 4.5.
TEST(PipelineLinks, SerialStreamsPlayedInTimeMoveAMessageOnlyOnceBothEndsPostedIt) {
  const ScheduleShape shape{2, 2, 1};
  const PipelineSchedule s = make_schedule(ScheduleKind::k1f1b, shape);
  SimulationCosts costs;
  costs.forward = 1;
  costs.backward_input = costs.backward_weight = 1;
  costs.p2p = 0.5;
  const SimulationResult serial = simulate_on_serial_streams(s, shape, Posting::kGrouped, costs);
  ASSERT_EQ(serial.error, "");
  EXPECT_EQ(serial.start[0], (std::vector<double>{0, 1.5, 5, 8.5})) << schedule_to_string(s, shape);
  EXPECT_EQ(serial.start[1], (std::vector<double>{1.5, 2.5, 5, 6}));
  EXPECT_DOUBLE_EQ(serial.makespan, 10.5);
  EXPECT_EQ(serial.busy, (std::vector<double>{6, 6}));
  EXPECT_DOUBLE_EQ(simulate(s, shape, costs).makespan, 10);
  // A posting that deadlocks says so, with check_on_serial_streams' words.
  const SimulationResult ahead = simulate_on_serial_streams(s, shape, Posting::kAhead, costs);
  EXPECT_TRUE(ahead.deadlock);
  EXPECT_EQ(ahead.error, check_on_serial_streams(s, shape, Posting::kAhead));
}

// In every schedule and the posting a stage takes, no action starts before each message it
// receives has arrived (its sender's action ended, plus the message's time), and the step is never
// shorter than with sends that never block (simulate: MPI's, each action as early as its inputs
// allow); the ranks compute the same.
TEST(PipelineLinks, OnSerialStreamsNoActionStartsBeforeItsMessagesArrived) {
  SimulationCosts costs;
  costs.forward = 1;
  costs.backward_input = 1.3;
  costs.backward_weight = 0.7;
  costs.p2p = 0.25;
  for (const Case& c : every_case()) {
    const PipelineSchedule s = make_schedule(c.kind, c.shape);
    const Posting posting = serial_posting(s, c.shape).value();
    const SimulationResult played = simulate_on_serial_streams(s, c.shape, posting, costs);
    ASSERT_EQ(played.error, "") << name(c);
    const SimulationResult by_tag = simulate(s, c.shape, costs);
    EXPECT_GE(played.makespan, by_tag.makespan - 1e-9) << name(c);
    for (size_t r = 0; r < s.size(); ++r) EXPECT_NEAR(played.busy[r], by_tag.busy[r], 1e-9) << name(c);
    for (int r = 0; r < c.shape.stages; ++r) {
      const auto& actions = s[static_cast<size_t>(r)];
      for (size_t i = 0; i < actions.size(); ++i) {
        for (const PostedMessage& in : messages_of(actions[i], r, c.shape).receive) {
          const auto& theirs = s[static_cast<size_t>(in.peer)];
          for (size_t j = 0; j < theirs.size(); ++j) {
            const ActionMessages m = messages_of(theirs[j], in.peer, c.shape);
            if (m.send.empty() || !(m.send[0].message == in.message)) continue;
            const double arrived =
                played.start[static_cast<size_t>(in.peer)][j] + action_cost(theirs[j], in.peer, costs) + costs.p2p;
            EXPECT_GE(played.start[static_cast<size_t>(r)][i], arrived - 1e-9) << name(c) << " " << describe(in.message);
          }
        }
      }
    }
  }
}

// What PipelineStage walks: every action once, in order; every message an action receives posted
// before it runs and every message it sends after it, each once, under every posting.
TEST(PipelineLinks, ARanksStreamRunsEachActionOnceWithItsMessagesAroundIt) {
  for (const Case& c : every_case()) {
    const PipelineSchedule s = make_schedule(c.kind, c.shape);
    for (Posting posting : {Posting::kAhead, Posting::kGrouped, Posting::kPairs, Posting::kDeferred}) {
      for (int r = 0; r < c.shape.stages; ++r) {
        const std::vector<Action>& actions = s[static_cast<size_t>(r)];
        std::vector<LinkMessage> received, sent;
        int next = 0;
        for (const StreamItem& item : rank_stream(actions, r, c.shape, posting)) {
          if (item.action < 0) {
            for (const PostedMessage& m : item.group) (m.send ? sent : received).push_back(m.message);
            continue;
          }
          ASSERT_EQ(item.action, next++) << name(c);
          const ActionMessages m = messages_of(actions[static_cast<size_t>(item.action)], r, c.shape);
          for (const PostedMessage& in : m.receive) {
            EXPECT_EQ(std::count(received.begin(), received.end(), in.message), 1) << name(c) << " " << describe(in.message);
          }
          for (const PostedMessage& out : m.send) {
            EXPECT_EQ(std::count(sent.begin(), sent.end(), out.message), 0) << name(c) << " " << describe(out.message);
          }
        }
        EXPECT_EQ(next, static_cast<int>(actions.size())) << name(c);
        int receives = 0, sends = 0;
        for (const Action& a : actions) {
          const ActionMessages m = messages_of(a, r, c.shape);
          receives += static_cast<int>(m.receive.size());
          sends += static_cast<int>(m.send.size());
        }
        EXPECT_EQ(static_cast<int>(received.size()), receives) << name(c);
        EXPECT_EQ(static_cast<int>(sent.size()), sends) << name(c);
      }
    }
  }
}

}  // namespace
}  // namespace ht::test

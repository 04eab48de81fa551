// Run under mpirun (ctest does, with 2 and 4 ranks): the NCCL-like pipeline links
// (parallel/nccl_like_communicator.h) on real MPI ranks. Each rank plays its stream of every
// schedule (parallel/pipeline_links.h: rank_stream) with small tensors that name their message,
// under every posting, and the job must run or deadlock exactly where the serial streams' check
// says NCCL would; a deadlock is caught by the timeout, which is short only where the check says
// the posting deadlocks (so no outcome here depends on how fast the machine is).
#include "parallel/nccl_like_communicator.h"
#include "parallel/pipeline_links.h"
#include "parallel/serial_streams.h"
#include "parallel/process_grid.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace ht {
namespace {

ProcessGrid& grid() {
  static ProcessGrid g = make_process_grid();
  return g;
}

// A fresh NCCL-like group over every rank, so that a case given up leaves nothing to the next.
std::shared_ptr<NcclLikeCommunicator> links(double timeout_s) {
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  auto links = std::make_shared<NcclLikeCommunicator>(std::make_shared<MpiCommunicator>(comm, grid().rank));
  links->set_timeout(timeout_s);
  return links;
}

at::Tensor named(const LinkMessage& m) {
  return at::tensor({static_cast<int64_t>(m.micro_batch), static_cast<int64_t>(m.to_vs), m.gradient ? 1L : 0L});
}

int tag_of(const LinkMessage& m) { return (m.micro_batch * 64 + m.to_vs) * 2 + (m.gradient ? 1 : 0); }

// "" where this rank's stream ran to its end with every message the one it expected; else why not.
std::string play(Communicator& c, const std::vector<Action>& actions, ScheduleShape shape, Posting posting) {
  try {
    for (const StreamItem& item : rank_stream(actions, c.rank(), shape, posting)) {
      if (item.action >= 0) continue;  // a compute: nothing to post
      std::vector<PeerMessage> group;
      std::vector<std::pair<LinkMessage, at::Tensor>> received;
      for (const PostedMessage& p : item.group) {
        at::Tensor t = p.send ? named(p.message) : at::full({3}, -1L);
        group.push_back({p.send, t, p.peer, tag_of(p.message), describe(p.message)});
        if (!p.send) received.emplace_back(p.message, t);
      }
      c.post_group(std::move(group))->wait();
      for (const auto& [m, t] : received) {
        if (!t.equal(named(m))) return "the bytes received for " + describe(m) + " are another message's";
      }
    }
  } catch (const CommunicationError& e) {
    return e.what();
  }
  return "";
}

bool any_rank(bool mine) {
  int flag = mine ? 1 : 0, any = 0;
  MPI_Allreduce(&flag, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any != 0;
}

const char* posting_name(Posting p) {
  return p == Posting::kAhead ? "ahead" : p == Posting::kGrouped ? "grouped" : p == Posting::kPairs ? "pairs" : "deferred";
}

// Every schedule at this job's stage count, every posting: the ranks run to the end where
// check_on_serial_streams says NCCL's serial streams do, and stop at the timeout, naming what they
// wait for, where it says they deadlock. Today's MPI posting (receives ahead) deadlocks every one.
TEST(NcclLikeLinks, EveryPostingRunsOrDeadlocksOnRanksWhereTheSerialStreamsCheckSays) {
  const int p = grid().world;
  int ran = 0, deadlocked = 0;
  for (ScheduleKind kind : {ScheduleKind::kGpipe, ScheduleKind::k1f1b, ScheduleKind::kInterleaved1f1b, ScheduleKind::kZbH1}) {
    for (int m : {1, p + 1, 2 * p}) {
      const ScheduleShape shape{p, m, kind == ScheduleKind::kInterleaved1f1b ? 2 : 1};
      if (!schedule_refusal(kind, shape).empty()) continue;
      const PipelineSchedule schedule = make_schedule(kind, shape);
      for (Posting posting : {Posting::kAhead, Posting::kGrouped, Posting::kPairs, Posting::kDeferred}) {
        const std::string name = std::string(choice_name(kind)) + " m" + std::to_string(m) + " " + posting_name(posting);
        const bool runs = check_on_serial_streams(schedule, shape, posting).empty();
        const auto group = links(runs ? 120.0 : 0.5);
        const std::string why = play(*group, schedule[static_cast<size_t>(grid().rank)], shape, posting);
        const bool stopped = any_rank(!why.empty());
        EXPECT_EQ(!stopped, runs) << name << ": " << why;
        if (!runs && !why.empty()) {
          EXPECT_NE(why.find("still waiting: this stage"), std::string::npos) << name << ": " << why;
        }
        (runs ? ran : deadlocked) += 1;
      }
    }
  }
  EXPECT_GT(ran, 4);
  EXPECT_GT(deadlocked, 4);
}

// A rank that posts a link's receives in another order than its sender posts the sends: NCCL would
// hand it the wrong tensor; here the receiver names both messages.
TEST(NcclLikeLinks, AReceiveMatchedWithAnotherMessageNamesBoth) {
  const int p = grid().world, last = p - 1;
  const ScheduleShape shape{p, 2, 1};
  PipelineSchedule s = make_schedule(ScheduleKind::kGpipe, shape);
  std::swap(s[static_cast<size_t>(last)][0], s[static_cast<size_t>(last)][1]);  // micro-batch 1's forward first
  // The receiver's message comes as soon as its sender posts; the senders then wait for ever.
  const auto group = links(grid().rank == last ? 120.0 : 5.0);
  const std::string why = play(*group, s[static_cast<size_t>(grid().rank)], shape, Posting::kGrouped);
  any_rank(!why.empty());
  if (grid().rank == last) {
    EXPECT_NE(why.find("sent the activation for virtual stage " + std::to_string(last) + " of micro-batch 0"),
              std::string::npos)
        << why;
    EXPECT_NE(why.find("posted the receive for the activation for virtual stage " + std::to_string(last) +
                       " of micro-batch 1"),
              std::string::npos)
        << why;
  }
}

// A send completes only when its receive is posted (NCCL's, unlike MPI's buffered small sends):
// two ranks that each send before they receive deadlock, and one group of both runs.
TEST(NcclLikeLinks, SendsAreSynchronousAndAGroupProgressesItsCallsTogether) {
  if (grid().world != 2) GTEST_SKIP() << "two ranks";
  const int other = 1 - grid().rank;
  at::Tensor mine = at::full({4}, static_cast<float>(grid().rank)), theirs = at::empty({4});
  {
    const auto group = links(1.0);
    std::string why;
    try {
      group->isend(mine, other, 0, "a rank's number");
      group->irecv(theirs, other, 0, "a rank's number");
    } catch (const CommunicationError& e) {
      why = e.what();
    }
    EXPECT_TRUE(any_rank(!why.empty()));
    EXPECT_NE(why.find("still waiting: this stage sends a rank's number to stage " + std::to_string(other)),
              std::string::npos)
        << why;
  }
  const auto group = links(120.0);
  std::vector<PeerMessage> both;
  both.push_back({true, mine, other, 0, "a rank's number"});
  both.push_back({false, theirs, other, 0, "a rank's number"});
  group->post_group(std::move(both))->wait();
  EXPECT_TRUE(theirs.equal(at::full({4}, static_cast<float>(other))));
}

}  // namespace
}  // namespace ht

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ht::grid();
  const int failed = RUN_ALL_TESTS();
  ht::finalize_process_grid();
  return failed;
}

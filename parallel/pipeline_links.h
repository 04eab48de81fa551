#pragma once
// The messages a pipeline schedule sends on each directed link between two ranks, in the order
// the sender posts them and in the order the receiver posts its receives (parallel/pipeline_stage.h
// posts a send after the action that produces it and the receives in the order of the actions
// that read them). MPI matches a receive to a send by tag, so any two orders meet; NCCL matches
// the messages of one link in posting order, not by tag (issue 67): a link whose two orders
// differ would hand a receive the wrong tensor, or wait for ever. This is the check that says,
// schedule by schedule, whether a schedule can run over NCCL as posted.

#include "base/choice.h"
#include "parallel/pipeline_schedule.h"

#include <optional>
#include <string>
#include <vector>

namespace ht {

// How a pipeline group carries a stage's messages on CPU ranks (parallel.pipeline_p2p): auto, the
// backend's own (MPI, matched by tag); nccl_like, as NCCL would on GPUs
// (parallel/nccl_like_communicator.h), to check on CPU what a GPU run does.
enum class PipelineP2p : uint8_t { kAuto, kNcclLike };
template <>
struct ChoiceNames<PipelineP2p> {
  static constexpr std::pair<PipelineP2p, const char*> table[] = {{PipelineP2p::kAuto, "auto"},
                                                                  {PipelineP2p::kNcclLike, "nccl_like"}};
};

// One message: the activation a forward of virtual stage to_vs - 1 sends to_vs's rank, or the
// input gradient a backward of to_vs + 1 sends to_vs's rank (`gradient`).
struct LinkMessage {
  int micro_batch = 0;
  int to_vs = 0;
  bool gradient = false;
};
bool operator==(const LinkMessage& a, const LinkMessage& b);
bool operator<(const LinkMessage& a, const LinkMessage& b);

struct LinkOrder {
  int from = 0, to = 0;               // ranks
  std::vector<LinkMessage> sent;      // as `from` posts the sends
  std::vector<LinkMessage> received;  // as `to` posts the receives
};

// Every directed link that carries a message, ordered by (from, to).
std::vector<LinkOrder> link_orders(const PipelineSchedule& schedule, ScheduleShape shape);

// "" where on every link the receiver posts its receives in the order the sender posts its sends;
// else the first link and position where they part, both messages named.
std::string check_link_order(const PipelineSchedule& schedule, ScheduleShape shape);

// How a rank posts its messages on one serial stream, as NCCL runs them: each send or receive holds
// the stream until its peer's match is running too, and only the calls of one group progress
// independently of each other.
enum class Posting {
  // Today's PipelineStage: the receives of the next `lookahead` actions posted ahead of the action
  // that reads them, each alone, and each action's send alone after it.
  kAhead,
  // Megatron's batch_isend_irecv: after each action, one group of its send and the next action's
  // receive (the first action's receive alone before it).
  kGrouped,
  // As kGrouped, with a forward and the backward right after it as one unit (1F1B's steady state,
  // as Megatron's interleaved schedule groups both directions): one group of a unit's sends and
  // the next unit's receives.
  kPairs,
  // As kGrouped, but sends wait past the actions that send and receive nothing (ZB-H1's weight
  // halves), posted with the receives of the next action that has a message: the sender computes
  // on where kGrouped would hold it in a lone send until a receiver busy elsewhere posts its match.
  kDeferred,
};

// One send or receive a rank posts.
struct PostedMessage {
  bool send = false;
  int peer = 0;  // the rank at the link's other end
  LinkMessage message;
};
// What a rank's stream does next: run its action number `action` (>= 0), or post `group` together.
struct StreamItem {
  int action = -1;
  std::vector<PostedMessage> group;
};
// What action `a` of rank `rank` receives before it runs and sends after it (none, or one each:
// a message between two virtual stages of one rank is not sent).
struct ActionMessages {
  std::vector<PostedMessage> receive, send;
};
ActionMessages messages_of(const Action& a, int rank, ScheduleShape shape);

// Rank `rank`'s stream under `posting`: its actions in order, with the groups posted between
// them. What parallel/pipeline_stage.h walks, and what parallel/serial_streams.h plays.
std::vector<StreamItem> rank_stream(const std::vector<Action>& actions, int rank, ScheduleShape shape, Posting posting,
                                    size_t lookahead = kReceiveLookahead);

// "each action's send grouped with the next action's receive", for the log.
std::string describe(Posting posting);

// "the gradient for virtual stage 2 of micro-batch 5"
std::string describe(const LinkMessage& m);

}  // namespace ht

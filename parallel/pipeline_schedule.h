#pragma once
// Pipeline-parallel schedules: which forward and backward each pipeline rank runs, in which order,
// for one step of `micro_batches` micro-batches. The model is cut into stages * virtual_stages
// consecutive virtual stages; rank r holds chunks c = 0..v-1, chunk c being virtual stage
// c * stages + r (Megatron's interleaved layout; with v = 1 rank r holds stage r). A schedule is
// pure data, so it can be checked and simulated here without a model: the trainer only walks its
// rank's list, receiving what an action needs and sending what it produces.

#include "base/choice.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ht {

enum class ActionKind {
  kForward,
  kBackward,        // the whole backward of a micro-batch through a chunk (input and weight gradients)
  kBackwardInput,   // zero-bubble half: input gradients, on the critical path (sent to the previous stage)
  kBackwardWeight,  // zero-bubble half: weight gradients, which nobody waits for, so they fill bubbles
};

struct Action {
  ActionKind kind = ActionKind::kForward;
  int micro_batch = 0;
  int chunk = 0;  // which of the rank's virtual_stages chunks
};
bool operator==(const Action& a, const Action& b);
bool operator!=(const Action& a, const Action& b);

// Per rank, the actions it runs, strictly in that order.
using PipelineSchedule = std::vector<std::vector<Action>>;

// Named as a config or command line spells them (base/choice.h).
enum class ScheduleKind : uint8_t { kGpipe, k1f1b, kInterleaved1f1b, kZbH1 };
template <>
struct ChoiceNames<ScheduleKind> {
  static constexpr std::pair<ScheduleKind, const char*> table[] = {
      {ScheduleKind::kGpipe, "gpipe"}, {ScheduleKind::k1f1b, "1f1b"},
      {ScheduleKind::kInterleaved1f1b, "interleaved_1f1b"}, {ScheduleKind::kZbH1, "zb_h1"}};
};

// Over a group that matches by tag (MPI), a stage posts the receives of its next
// kReceiveLookahead actions (parallel/pipeline_links.h: Posting::kAhead) ahead of the action that
// reads them, so a message can land while it computes the actions
// before: the buffers of the two after the running one are in memory beside it.
constexpr size_t kReceiveLookahead = 3;

struct ScheduleShape {
  int stages = 1;          // pipeline ranks
  int micro_batches = 1;   // per step
  int virtual_stages = 1;  // chunks per rank (> 1 only for interleaved_1f1b)
};

// "" when make_schedule(kind, shape) can run that shape, else one sentence saying what is wrong
// and what would work, so a config error reads as advice rather than a crash.
std::string schedule_refusal(ScheduleKind kind, ScheduleShape shape);

// Megatron's interleaved layout: chunk c of rank r is virtual stage c * stages + r, so that a
// micro-batch visits every rank once per chunk and the ranks stay busy v times more often.
int virtual_stage(int rank, int chunk, ScheduleShape shape);
int rank_of_virtual_stage(int vs, ScheduleShape shape);
int chunk_of_virtual_stage(int vs, ScheduleShape shape);

// One action list per rank. Precondition: schedule_refusal(kind, shape) is "" (throws
// std::invalid_argument with that sentence otherwise). Every generator runs the backwards (or
// weight halves) of each chunk in increasing micro-batch order: the trainer accumulates weight
// gradients in that order, which keeps training bit-identical to one rank.
//  - gpipe: all forwards, then all backwards.
//  - 1f1b: min(stages - r - 1, m) warmup forwards, then one forward one backward, then cooldown.
//  - interleaved_1f1b: Megatron's interleaved schedule (micro-batches in groups of `stages`).
//  - zb_h1: 1f1b with backwards split into input and weight halves; rank r keeps its last r
//    weight halves pending, which fill the end of the step. No rank holds more than min(stages, m)
//    micro-batches, 1f1b's rank-0 peak, so the pipeline's peak activation memory is 1f1b's.
PipelineSchedule make_schedule(ScheduleKind kind, ScheduleShape shape);

// "" or the first problem of a schedule: every (micro-batch, chunk) of every rank has exactly one
// forward and either one kBackward or one kBackwardInput followed later by one kBackwardWeight;
// forward before backward; indices in range; input-gradient parts (kBackward, kBackwardInput)
// and weight-gradient parts (kBackward, kBackwardWeight) of each chunk in increasing micro-batch
// order. It does not look across ranks: simulate() finds orders that wait on each other.
std::string check_schedule(const PipelineSchedule& schedule, ScheduleShape shape);

// Costs of one action in arbitrary time units. A kBackward costs backward_input + backward_weight.
struct SimulationCosts {
  double forward = 1, backward_input = 1, backward_weight = 1;
  double p2p = 0;                   // from a send to when the neighbour can use it
  std::vector<double> stage_scale;  // per rank, multiplies its compute costs (an uneven partition); empty: all 1
};

// What `a` costs on `rank`: its kind's cost times the rank's stage_scale.
double action_cost(const Action& a, int rank, const SimulationCosts& c);
// The most micro-batch-chunks a rank's list holds at once: +1 at a forward, -1 when its last
// backward part runs. In list order, so independent of timing.
int peak_in_flight(const std::vector<Action>& actions);

struct SimulationResult {
  bool deadlock = false;
  std::string error;  // why the simulation stopped: a deadlock, or a malformed schedule
  double makespan = 0;
  std::vector<double> busy;  // per rank: time spent computing
  double bubble = 0;         // 1 - sum(busy) / (ranks * makespan): the idle fraction
  // Per rank: the most micro-batch-chunks whose forward is done and whose last backward part
  // (kBackward or kBackwardWeight) is not, i.e. whose activations the rank must hold.
  std::vector<int> peak_in_flight;
  std::vector<std::vector<double>> start;  // per rank, per action: start time
};

// Plays the schedule: each rank runs its list strictly in order; an action starts when its rank
// is free and what it needs has finished: a forward of virtual stage vs > 0 needs vs - 1's
// forward of that micro-batch; a backward (or backward-input) needs its own forward and the
// input gradient from vs + 1 (none for the last virtual stage); a backward-weight needs its
// backward-input. Crossing ranks adds p2p. Sends never block. When no rank can go on while some
// still have actions, it is a deadlock, and `error` names a waiting rank and what it waits for.
SimulationResult simulate(const PipelineSchedule& schedule, ScheduleShape shape, SimulationCosts costs = {});

// Micro-batches each virtual stage holds at once under `kind`: its rank's simulated peak shared
// among the rank's chunks, one count per virtual stage (PartitionOptions::in_flight), as the
// trainer lays a pipeline out and the planner predicts one.
std::vector<int> in_flight_per_virtual_stage(ScheduleKind kind, ScheduleShape shape);

// The bubble fraction a schedule is expected to have with uniform stages and no communication
// cost, which a benchmark compares the measured one against. gpipe and 1f1b: (p-1)/(m+p-1)
// (independent of the forward/backward ratio); interleaved_1f1b: (p-1)/(v*m+p-1), the 1f1b
// bubble divided by about v; zb_h1: (p-1)/(3m+p-1), the Zero Bubble paper's (p-1)(F+B-W) idle
// time per rank against 3m busy with F = B = W, i.e. about a third of 1f1b's (make_schedule's
// zb_h1 simulates to exactly this when m >= stages).
double theoretical_bubble(ScheduleKind kind, ScheduleShape shape);

// "forward of micro-batch 3, chunk 0": what messages call an action.
std::string describe(const Action& action);
// One line per rank, "rank 0: F0 F1 B0 ..." (b/w for the input/weight halves, ".c" for chunk c
// when v > 1): for test failures and logs.
std::string schedule_to_string(const PipelineSchedule& schedule, ScheduleShape shape);

}  // namespace ht

#include "planner/pipeline_terms.h"

#include "parallel/pipeline_schedule.h"
#include "parallel/serial_streams.h"
#include "parallel/stage_partition.h"
#include "planner/machine.h"
#include "planner/gradient_blocks.h"
#include "planner/weight_copy_terms.h"

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>
#include <stdexcept>
#include <tuple>
#include <utility>

namespace ht {
namespace {

// The point whose block times give the blocks' shares: the largest micro-batch at the plan's
// precision (a small point's times are mostly the recorder's per-kernel overhead: measured, GPT's
// layers took 25x their share at micro-batch 4).
const ProfilePoint* timed_point(const ModelProfile& profile, const Plan& plan) {
  const ProfilePoint* best = nullptr;
  for (const ProfilePoint& pt : profile.points) {
    if (pt.blocks.empty() || pt.precision != plan.precision || pt.threads != profile.threads) continue;
    if (best == nullptr || pt.micro_batch > best->micro_batch) best = &pt;
  }
  return best;
}

// A stage's memory beyond its state and its blocks' held bytes per micro-batch in flight (the
// partition's peak), from the trace scaled by `scale`: what it keeps per micro-batch in flight
// of what it receives and sends, and what it needs once (its kernels' peak above one micro-batch's
// held bytes, and `receives`: its receive buffers beside its backward, backward_receive_bytes).
struct StageExtra {
  int64_t kept = 0, once = 0;
};

// Block b's weights' casts in `mem`'s trace (block_memory's weight_casts; 0 where it has none).
int64_t weight_cast_bytes(const ProfilePoint& mem, int b) {
  return static_cast<size_t>(b) < mem.block_weight_cast_bytes.size() ? mem.block_weight_cast_bytes[static_cast<size_t>(b)] : 0;
}

// What a block keeps per micro-batch in flight: its held bytes at `scale` (the plan's activations
// over the point's: a policy's kept share and the micro-batch's size), without the weights' casts
// where the weights' 16-bit copies are kept (`copies`: the stage holds each copy once, whatever
// is in flight, beside its state).
int64_t held_per_micro_batch(const ProfilePoint& mem, int b, double scale, bool copies) {
  const int64_t casts = copies ? weight_cast_bytes(mem, b) : 0;
  return static_cast<int64_t>(scale * static_cast<double>(mem.block_held_bytes[static_cast<size_t>(b)] - casts));
}

StageExtra stage_extra(const ProfilePoint& mem, double scale, const StagePlan& s, bool first, bool last,
                       int64_t in_flight, int64_t micro_batch, int64_t receives, bool copies) {
  auto scaled = [scale](int64_t v) { return static_cast<int64_t>(scale * static_cast<double>(v)); };
  int64_t held = 0, top = 0;  // the blocks' held bytes so far; the stage's peak over one micro-batch
  const int end = s.first_block + s.blocks;
  // The stage's held output, kept through its other blocks' backward (the last block's own walk keeps it).
  const int64_t output = last ? 0 : mem.block_sent_held_bytes[static_cast<size_t>(end - 1)];
  // Kept copies: the blocks as they are without their weights' casts (the stage holds the copies).
  const bool without = copies && mem.block_peak_without_casts_bytes.size() == mem.block_peak_bytes.size() &&
                       mem.block_peak_backward_without_casts_bytes.size() == mem.block_peak_backward_bytes.size();
  const std::vector<int64_t>& peak = without ? mem.block_peak_without_casts_bytes : mem.block_peak_bytes;
  const std::vector<int64_t>& peak_backward =
      without ? mem.block_peak_backward_without_casts_bytes : mem.block_peak_backward_bytes;
  for (int b = s.first_block; b < end; ++b) {
    const size_t v = 4 * static_cast<size_t>(b) + (b > s.first_block ? 1 : 0) + (b + 1 < end ? 2 : 0);
    const int64_t backward = peak_backward[v] + (b + 1 < end ? output : 0);
    top = std::max(top, held + std::max(peak[v], backward));
    held += mem.block_held_bytes[static_cast<size_t>(b)] - (without ? weight_cast_bytes(mem, b) : 0);
  }
  StageExtra x;
  x.once = scaled(std::max<int64_t>(0, top - held)) + receives;
  if (!first) {
    const int64_t in = stage_boundary_bytes(mem, s.first_block - 1, micro_batch);
    x.kept += in * in_flight;  // the received input, kept for the micro-batch's backward
    // The previous micro-batch's input gradient, sent after its backward: its buffer lives until
    // the stage reaps the send (after its next one), so whether it is still there when the next
    // backward peaks depends on when MPI completed it. Counted: the prediction is the upper bound.
    x.once += in;
  }
  // The output sent, kept until the micro-batch's backward where its own blocks did not keep it.
  if (!last) x.kept += scaled(mem.block_sent_unheld_bytes[static_cast<size_t>(end - 1)]) * in_flight;
  return x;
}

// Per virtual stage, the most its rank's receive buffers hold beside one of its backwards
// (parallel/pipeline_stage.cpp): the gradient it computes from, alive until that backward ends, and
// those posted for the rank's next kReceiveLookahead - 1 actions (activations for forwards after the
// first stage, gradients for backwards before the last). A stage peaks in a backward: its forwards
// see the same buffers without the backward's working set.
std::vector<int64_t> backward_receive_bytes(const PipelineSchedule& schedule, const ScheduleShape& shape,
                                            const Partition& partition, const ProfilePoint& mem, int64_t micro_batch) {
  const int parts = static_cast<int>(partition.stages.size());
  auto cut_after = [&](int vs) {
    const StagePlan& s = partition.stages[static_cast<size_t>(vs)];
    return stage_boundary_bytes(mem, s.first_block + s.blocks - 1, micro_batch);
  };
  auto received = [&](const Action& a, int vs) -> int64_t {
    if (a.kind == ActionKind::kForward) return vs > 0 ? cut_after(vs - 1) : 0;
    if (a.kind == ActionKind::kBackwardWeight) return 0;
    return vs + 1 < parts ? cut_after(vs) : 0;
  };
  std::vector<int64_t> most(static_cast<size_t>(parts), 0);
  for (int r = 0; r < static_cast<int>(schedule.size()); ++r) {
    const std::vector<Action>& actions = schedule[static_cast<size_t>(r)];
    for (size_t i = 0; i < actions.size(); ++i) {
      if (actions[i].kind != ActionKind::kBackward && actions[i].kind != ActionKind::kBackwardInput) continue;
      const int vs = virtual_stage(r, actions[i].chunk, shape);
      int64_t bytes = received(actions[i], vs);
      for (size_t j = i + 1; j < std::min(actions.size(), i + kReceiveLookahead); ++j)
        bytes += received(actions[j], virtual_stage(r, actions[j].chunk, shape));
      most[static_cast<size_t>(vs)] = std::max(most[static_cast<size_t>(vs)], bytes);
    }
  }
  return most;
}

// The point whose trace gives the blocks' memory: the plan's micro-batch where one was measured or
// traced, else the nearest; null where no point has the blocks' memory.
const ProfilePoint* memory_point(const ModelProfile& profile, const Plan& plan, size_t blocks) {
  const ProfilePoint* best = nullptr;
  for (const ProfilePoint& pt : profile.points) {
    if (pt.block_held_bytes.size() != blocks || pt.block_peak_bytes.size() != 4 * blocks ||
        pt.block_peak_backward_bytes.size() != 4 * blocks || pt.block_sent_unheld_bytes.size() != blocks ||
        pt.block_sent_held_bytes.size() != blocks || pt.precision != plan.precision || pt.threads != profile.threads) continue;
    if (best == nullptr || std::llabs(pt.micro_batch - plan.micro_batch) < std::llabs(best->micro_batch - plan.micro_batch))
      best = &pt;
  }
  return best;
}

// A block's state beside its parameters: gradient and optimizer state per parameter byte, in the
// whole model's proportion.
double state_per_parameter_byte(const ModelProfile& profile, const Plan& plan) {
  return profile.parameter_bytes > 0
             ? static_cast<double>(gradient_block_bytes(profile, plan) + profile.optimizer_state_bytes) / profile.parameter_bytes
             : 0;
}

// Each block's cost at the plan's micro-batch: its share of the measured block times scaled to
// `fb_ms`, activations in proportion to its time (the profile records them for the whole step),
// state from its parameters (gradients and optimizer state in the whole model's proportion).
std::vector<BlockCost> block_costs(const ModelProfile& profile, const Plan& plan, const ProfilePoint& pt, double fb_ms,
                                   int64_t activations) {
  double measured = 0;
  for (const BlockTime& b : pt.blocks) measured += b.forward_ms + b.backward_ms;
  const double scale = measured > 0 ? fb_ms / measured : 0;
  const double state_per_byte = state_per_parameter_byte(profile, plan);
  std::vector<BlockCost> costs;
  for (size_t b = 0; b < pt.blocks.size(); ++b) {
    BlockCost c;
    c.forward_ms = pt.blocks[b].forward_ms * scale;
    c.backward_ms = pt.blocks[b].backward_ms * scale;
    const double share = measured > 0 ? (pt.blocks[b].forward_ms + pt.blocks[b].backward_ms) / measured : 0;
    c.activation_bytes = static_cast<int64_t>(share * static_cast<double>(activations));
    const int64_t params = b < profile.block_parameter_bytes.size() ? profile.block_parameter_bytes[b] : 0;
    c.state_bytes = static_cast<int64_t>(static_cast<double>(params) * state_per_byte);
    c.parameters = params / 4;
    costs.push_back(c);
  }
  return costs;
}

// The link between neighbouring stages: ranks are (stage x replicas + replica) x tensor + tensor
// rank (parallel/process_grid.h), so a stage is replicas x tensor ranks apart from the next, and
// some cut crosses a node once the pipeline spans more than one.
double transfer_ms(const Machine& machine, const Plan& plan, int64_t bytes) {
  if (bytes <= 0) return 0;
  const bool one_node = static_cast<int64_t>(plan.devices()) <= machine.devices_per_node;
  const double gbps = one_node ? machine.intra_node_gbps : machine.inter_node_gbps;
  const double latency_us = one_node ? machine.intra_node_latency_us : machine.inter_node_latency_us;
  return latency_us * 1e-3 + static_cast<double>(bytes) / (gbps * 1e9) * 1e3;
}

}  // namespace

namespace {

// The plan's cut (Plan::stage_blocks), else the one balancing the blocks' times; nothing, with
// p refused, where the given cut does not fit the model.
std::optional<Partition> cut_stages(const std::vector<BlockCost>& costs, const Plan& plan,
                                    const PartitionOptions& options, Prediction& p) {
  if (plan.stage_blocks.empty()) return balance_stages(costs, options);
  try {
    return partition_from_counts(costs, plan.stage_blocks, options);
  } catch (const std::invalid_argument& e) {
    p.fits = false;
    p.why_not = e.what();
    return std::nullopt;
  }
}

// Which rank each block of `partition` runs on.
std::vector<int> ranks_of_blocks(const Partition& partition, const ScheduleShape& shape) {
  std::vector<int> rank_of_block;
  for (size_t vs = 0; vs < partition.stages.size(); ++vs)
    rank_of_block.insert(rank_of_block.end(), static_cast<size_t>(partition.stages[vs].blocks),
                         rank_of_virtual_stage(static_cast<int>(vs), shape));
  return rank_of_block;
}

// The cut (cut_stages) where a block's cost depends on the rank it lands on (`costs_at`: per-stage
// plans recompute more on the first stages, AdaPipe's): the exact balance of each virtual stage's
// own costs (balance_stages over one list per stage, each stage's peak within `limit_bytes` where
// it is set; nothing where none is), or the plan's cut. `costs` gets each block's as the chosen
// cut runs it.
template <typename CostsAt>
std::optional<Partition> cut_stages_by_rank(CostsAt&& costs_at, size_t blocks, const Plan& plan, const ScheduleShape& shape,
                                            PartitionOptions options, int64_t limit_bytes, Prediction& p,
                                            std::vector<BlockCost>& costs) {
  std::optional<Partition> cut;
  if (plan.stage_blocks.empty()) {
    std::vector<std::vector<BlockCost>> at_stage;
    for (int vs = 0; vs < options.stages; ++vs)
      at_stage.push_back(costs_at(std::vector<int>(blocks, rank_of_virtual_stage(vs, shape))));
    if (limit_bytes < 0) return std::nullopt;
    options.memory_limit_bytes = limit_bytes;
    try {
      cut = balance_stages(at_stage, options);
    } catch (const std::invalid_argument&) {
      if (limit_bytes == 0) throw;
      return std::nullopt;  // no cut within the limit
    }
    options.memory_limit_bytes = 0;
  } else {
    cut = cut_stages(costs_at(std::vector<int>(blocks, 0)), plan, options, p);  // refuses a cut that does not fit the model
    if (!cut) return cut;
  }
  costs = costs_at(ranks_of_blocks(*cut, shape));
  return partition_from_counts(costs, stage_block_counts(*cut), options);
}

// Per rank (pipeline stage): its chunks' time per micro-batch, peak (its state included) and state bytes.
struct RankTerms {
  std::vector<double> ms;
  std::vector<int64_t> peak, state;
};

// `scale` and `working`: per rank, its activations over the point's (0: no trace, the costs'
// shares by time alone) and the working set its recomputation adds once (pipeline_terms' per_rank).
RankTerms rank_terms(const Partition& partition, const std::vector<BlockCost>& costs, const PipelineSchedule& schedule,
                     const ScheduleShape& shape, const PartitionOptions& options, const ProfilePoint* mem,
                     const std::vector<double>& scale, const std::vector<int64_t>& working, int64_t micro_batch, bool copies) {
  const auto ranks = static_cast<size_t>(shape.stages);
  const int parts = static_cast<int>(partition.stages.size());
  RankTerms t{std::vector<double>(ranks, 0), std::vector<int64_t>(ranks, 0), std::vector<int64_t>(ranks, 0)};
  std::vector<int64_t> once(ranks, 0);  // a rank's chunks run one at a time: the largest's once
  std::vector<int64_t> receives;
  for (int vs = 0; vs < parts; ++vs) {
    const StagePlan& s = partition.stages[static_cast<size_t>(vs)];
    const auto r = static_cast<size_t>(rank_of_virtual_stage(vs, shape));
    t.ms[r] += s.ms;
    t.peak[r] += s.peak_bytes;
    for (int b = s.first_block; b < s.first_block + s.blocks; ++b) t.state[r] += costs[static_cast<size_t>(b)].state_bytes;
    if (scale[r] <= 0) continue;
    if (receives.empty()) receives = backward_receive_bytes(schedule, shape, partition, *mem, micro_batch);
    const StageExtra x = stage_extra(*mem, scale[r], s, vs == 0, vs + 1 == parts, options.in_flight[static_cast<size_t>(vs)],
                                     micro_batch, receives[static_cast<size_t>(vs)], copies);
    t.peak[r] += x.kept;
    // Kept 16-bit weights: the stage's copies once, whatever is in flight (held_per_micro_batch).
    if (copies)
      for (int b = s.first_block; b < s.first_block + s.blocks; ++b) t.peak[r] += weight_cast_bytes(*mem, b);
    once[r] = std::max(once[r], x.once);
  }
  for (size_t r = 0; r < ranks; ++r) t.peak[r] += once[r] + (r < working.size() ? working[r] : 0);
  return t;
}

// The tied weights a rank trains a copy of (ModelProfile::block_tied_reads: read by its blocks,
// registered by another rank's), each once, counted as its blocks' state is (block_costs: the
// gradient and optimizer state per parameter byte; the rank's share of the model's bytes follows).
void add_tied_copies(const ModelProfile& profile, const Plan& plan, const Partition& partition, const ScheduleShape& shape,
                     RankTerms& ranks) {
  if (profile.block_tied_reads.empty()) return;
  const double state_per_byte = state_per_parameter_byte(profile, plan);
  std::vector<int> rank_of_block(profile.block_tied_reads.size(), -1);
  for (size_t vs = 0; vs < partition.stages.size(); ++vs) {
    const StagePlan& s = partition.stages[vs];
    for (int b = s.first_block; b < s.first_block + s.blocks && static_cast<size_t>(b) < rank_of_block.size(); ++b)
      rank_of_block[static_cast<size_t>(b)] = rank_of_virtual_stage(static_cast<int>(vs), shape);
  }
  for (size_t r = 0; r < ranks.state.size(); ++r) {
    std::set<int> copies;
    int64_t bytes = 0;
    for (size_t b = 0; b < rank_of_block.size(); ++b) {
      if (rank_of_block[b] != static_cast<int>(r)) continue;
      for (const ModelProfile::TiedRead& t : profile.block_tied_reads[b]) {
        const auto owner = static_cast<size_t>(t.registered_by);
        if (owner < rank_of_block.size() && rank_of_block[owner] == static_cast<int>(r)) continue;
        if (copies.insert(t.parameter).second) bytes += t.bytes;
      }
    }
    const auto state = static_cast<int64_t>(static_cast<double>(bytes) * state_per_byte);
    ranks.state[r] += state;
    ranks.peak[r] += state;  // a rank's peak counts its state (StagePlan::peak_bytes)
  }
}

// Memory: the fullest rank's. Its activations replace one micro-batch's whole-model set; its
// share of the blocks' state, each block's unsharded: at "optimizer" the state terms are already
// the rank's share of the replica group's (planner/shard_terms.h), and a stage's replicas split
// its state as a model's replicas split the model's.
void fullest_rank_memory(const std::vector<BlockCost>& costs, const RankTerms& ranks, Prediction& p) {
  size_t fullest = 0;
  for (size_t r = 1; r < ranks.peak.size(); ++r)
    if (ranks.peak[r] > ranks.peak[fullest]) fullest = r;
  int64_t whole_state = 0;
  for (const BlockCost& c : costs) whole_state += c.state_bytes;
  const int64_t state = ranks.state[fullest];
  const double state_share = whole_state > 0 ? static_cast<double>(state) / static_cast<double>(whole_state) : 0;
  p.model_bytes = static_cast<int64_t>(static_cast<double>(p.model_bytes) * state_share);
  p.gradient_bytes = static_cast<int64_t>(static_cast<double>(p.gradient_bytes) * state_share);
  p.optimizer_state_bytes = static_cast<int64_t>(static_cast<double>(p.optimizer_state_bytes) * state_share);
  p.activation_bytes = ranks.peak[fullest] - state;
  p.peak_bytes = p.working_peak_bytes();
  p.stage_state_share = state_share;
  p.stage_peak_bytes = ranks.peak;  // as the fullest's is now: predict() adds what every rank holds beside
}

}  // namespace

namespace {

// The streams a stage posts on NCCL for `kind` at `shape` (serial_posting's choice), built once
// for the search's many plans of one shape; null where no posting runs. The last 8 shapes are kept
// (one of 64 stages and 512 micro-batches is about 8 MB).
std::shared_ptr<const SerialStreams> streams_of_stages(ScheduleKind kind, ScheduleShape shape) {
  using Key = std::tuple<int, int, int, int>;
  static std::mutex mutex;
  static std::map<Key, std::shared_ptr<const SerialStreams>> cache;
  static std::deque<Key> order;
  const Key key{static_cast<int>(kind), shape.stages, shape.micro_batches, shape.virtual_stages};
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (auto it = cache.find(key); it != cache.end()) return it->second;
  }
  const PipelineSchedule schedule = make_schedule(kind, shape);
  const std::optional<Posting> posting = serial_posting(schedule, shape);
  auto streams = posting ? std::make_shared<const SerialStreams>(schedule, shape, *posting) : nullptr;
  std::lock_guard<std::mutex> lock(mutex);
  if (cache.emplace(key, streams).second) order.push_back(key);
  while (order.size() > 8) {
    cache.erase(order.front());
    order.pop_front();
  }
  return streams;
}

}  // namespace

void pipeline_terms(const ModelProfile& profile, const Machine& machine, const Plan& plan, double fb_ms,
                    Prediction& p, bool activations_hold_casts, const std::vector<StageRecompute>* per_rank) {
  const ProfilePoint* pt = timed_point(profile, plan);
  const ScheduleKind kind = plan.schedule;
  const int chunks = kind == ScheduleKind::kInterleaved1f1b ? std::max(1, plan.virtual_stages) : 1;
  const ScheduleShape shape{plan.stages, static_cast<int>(plan.accumulation), chunks};
  const int parts = plan.stages * chunks;  // virtual stages, in model order (chunk c of rank r: c * stages + r)
  if (pt == nullptr || static_cast<int>(pt->blocks.size()) < parts || !schedule_refusal(kind, shape).empty()) {
    p.fits = false;
    p.why_not = pt == nullptr ? "no profiled block times to cut into stages"
                : static_cast<int>(pt->blocks.size()) < parts
                    ? "more stages than the model's " + std::to_string(pt->blocks.size()) + " blocks"
                    : schedule_refusal(kind, shape);
    return;
  }
  // Memory from the trace where a point has it: each block's held bytes per micro-batch in
  // flight, and once the stage's peak above them (stage_extra); otherwise a share by time. Scaled
  // from the point's micro-batch to the plan's activations (per rank, under per-stage plans).
  const ProfilePoint* mem = memory_point(profile, plan, pt->blocks.size());
  const bool copies = keeps_weight_copies(plan);
  // Kept copies: the held bytes without the casts scale as the activations without them do (the
  // casts are the same bytes at every micro-batch; the stage holds the copies once, rank_terms).
  const int64_t casts = copies && mem != nullptr ? weight_casts_alive_at_peak(profile, *mem) : 0;
  const auto ranks_n = static_cast<size_t>(plan.stages);
  std::vector<StageRecompute> work(ranks_n, StageRecompute{fb_ms, p.activation_bytes, 0});
  if (per_rank != nullptr && per_rank->size() == ranks_n) work = *per_rank;
  std::vector<double> scale(ranks_n, 0);
  std::vector<int64_t> working(ranks_n, 0);
  for (size_t r = 0; r < ranks_n; ++r) {
    working[r] = work[r].working_bytes;
    if (mem == nullptr || mem->activation_bytes() - casts <= 0) continue;
    const int64_t plan_activations = work[r].kept_bytes - (activations_hold_casts ? casts : 0);
    scale[r] = static_cast<double>(std::max<int64_t>(0, plan_activations)) / static_cast<double>(mem->activation_bytes() - casts);
  }
  // The blocks' costs where each runs on the rank `rank_of_block` names.
  auto costs_at = [&](const std::vector<int>& rank_of_block) {
    std::vector<std::vector<BlockCost>> of_rank(ranks_n);
    std::vector<BlockCost> costs(pt->blocks.size());
    for (size_t b = 0; b < costs.size(); ++b) {
      const auto r = static_cast<size_t>(rank_of_block[b]);
      if (of_rank[r].empty()) of_rank[r] = block_costs(profile, plan, *pt, work[r].fb_ms, work[r].kept_bytes);
      costs[b] = of_rank[r][b];
      if (scale[r] > 0) costs[b].activation_bytes = held_per_micro_batch(*mem, static_cast<int>(b), scale[r], copies);
    }
    return costs;
  };
  PartitionOptions options;
  options.stages = parts;
  options.in_flight = in_flight_per_virtual_stage(kind, shape);  // as the trainer lays a pipeline out
  std::vector<BlockCost> costs;
  std::optional<Partition> cut = cut_stages_by_rank(costs_at, pt->blocks.size(), plan, shape, options, 0, p, costs);
  if (!cut) return;
  // A rank's time and memory are its chunks'.
  const PipelineSchedule schedule = make_schedule(kind, shape);
  auto terms_of = [&](const Partition& partition, const std::vector<BlockCost>& at) {
    RankTerms t = rank_terms(partition, at, schedule, shape, options, mem, scale, working, plan.micro_batch, copies);
    add_tied_copies(profile, plan, partition, shape, t);
    return t;
  };
  RankTerms ranks = terms_of(*cut, costs);
  if (per_rank != nullptr && plan.stage_blocks.empty() && machine.device_memory > 0) {
    // Balanced by time alone, the fast stages (keeping the most) take blocks until a rank no
    // longer fits: cut again with each stage's peak limited to what the device leaves it beside
    // what the partition does not count (its chunks' extras, the batch).
    const int64_t room = machine.device_memory - machine.reserved_bytes(plan.weight_replicas() > 1, plan.tensor > 1, true) -
                         p.sampler_bytes - p.batch_bytes;
    int64_t fullest = 0, extra = 0;
    for (size_t r = 0; r < ranks.peak.size(); ++r) {
      int64_t counted = 0;
      for (size_t vs = 0; vs < cut->stages.size(); ++vs)
        if (static_cast<size_t>(rank_of_virtual_stage(static_cast<int>(vs), shape)) == r) counted += cut->stages[vs].peak_bytes;
      fullest = std::max(fullest, ranks.peak[r]);
      extra = std::max(extra, ranks.peak[r] - counted);
    }
    std::vector<BlockCost> within_costs;
    const std::optional<Partition> within =
        fullest > room && room - extra > 0
            ? cut_stages_by_rank(costs_at, pt->blocks.size(), plan, shape, options, (room - extra) / chunks, p, within_costs)
            : std::nullopt;
    if (within) {
      RankTerms t = terms_of(*within, within_costs);
      if (*std::max_element(t.peak.begin(), t.peak.end()) < fullest) {
        cut = within;
        costs = std::move(within_costs);
        ranks = std::move(t);
      }
    }
  }
  const Partition& partition = *cut;
  for (const StagePlan& s : partition.stages) p.stage_blocks.push_back(s.blocks);
  const std::vector<double>& rank_ms = ranks.ms;
  // The step: the schedule simulated with each rank's own times (one chunk of a micro-batch per action).
  double forward = 0, backward = 0, total_ms = 0;
  for (const BlockCost& c : costs) {
    forward += c.forward_ms;
    backward += c.backward_ms;
  }
  for (double ms : rank_ms) total_ms += ms;
  SimulationCosts sim;
  const double mean = total_ms > 0 ? total_ms / plan.stages : 1;
  sim.forward = forward / parts;
  sim.backward_input = sim.backward_weight = backward / parts / 2;
  double slowest = 0;
  for (double ms : rank_ms) {
    sim.stage_scale.push_back(ms / mean);
    slowest = std::max(slowest, ms);
  }
  // The largest cut the partition makes: every micro-batch crosses it, forward and back.
  int64_t cut_bytes = 0;
  for (int vs = 0; vs + 1 < parts; ++vs) {
    const StagePlan& s = partition.stages[static_cast<size_t>(vs)];
    cut_bytes = std::max(cut_bytes, stage_boundary_bytes(*pt, s.first_block + s.blocks - 1, plan.micro_batch));
  }
  const SimulationResult alone = simulate(schedule, shape, sim);
  sim.p2p = transfer_ms(machine, plan, cut_bytes);
  // On serial streams (NCCL) a message moves only once both ends have posted it, and a send holds
  // its rank: the streams played with the posting a stage takes.
  const std::shared_ptr<const SerialStreams> streams =
      machine.p2p_in_posting_order ? streams_of_stages(kind, shape) : nullptr;
  if (machine.p2p_in_posting_order && !streams) {
    p.fits = false;
    p.why_not = "no posting of the schedule's messages runs where they match in posting order (NCCL)";
    return;
  }
  const SimulationResult run = streams      ? streams->play(sim, /*starts=*/false)
                               : sim.p2p > 0 ? simulate(schedule, shape, sim)
                                             : alone;
  p.compute_ms = run.makespan;
  p.bubble_ms = run.makespan * run.bubble;
  p.transfer_ms = std::max(0.0, run.makespan - alone.makespan);
  fullest_rank_memory(costs, ranks, p);
  p.stage_imbalance = slowest / mean;
}

}  // namespace ht

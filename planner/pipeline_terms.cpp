#include "planner/pipeline_terms.h"

#include "parallel/pipeline_schedule.h"
#include "parallel/stage_partition.h"
#include "planner/machine.h"

#include <algorithm>
#include <numeric>

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

// Each block's cost at the plan's micro-batch: its share of the measured block times scaled to
// `fb_ms`, activations in proportion to its time (the profile records them for the whole step),
// state from its parameters (gradients and optimizer state in the whole model's proportion).
std::vector<BlockCost> block_costs(const ModelProfile& profile, const ProfilePoint& pt, double fb_ms,
                                   int64_t activations) {
  double measured = 0;
  for (const BlockTime& b : pt.blocks) measured += b.forward_ms + b.backward_ms;
  const double scale = measured > 0 ? fb_ms / measured : 0;
  const double state_per_byte =
      profile.parameter_bytes > 0
          ? static_cast<double>(profile.gradient_bytes + profile.optimizer_state_bytes) / profile.parameter_bytes
          : 0;
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

std::vector<int64_t> stage_cut_bytes(const StepTrace& trace, int blocks) {
  // Each tensor crosses the cuts from its producer's block to the last block whose forward reads it.
  std::vector<int> last_reader(trace.tensors.size(), -1);
  for (const TraceKernel& k : trace.kernels) {
    if (k.backward || k.block < 0) continue;
    for (int i : k.inputs) {
      if (i >= 0 && static_cast<size_t>(i) < last_reader.size())
        last_reader[static_cast<size_t>(i)] = std::max(last_reader[static_cast<size_t>(i)], k.block);
    }
  }
  std::vector<int64_t> change(static_cast<size_t>(std::max(blocks, 0)) + 1, 0);
  for (size_t i = 0; i < trace.tensors.size(); ++i) {
    const int producer = trace.tensors[i].producer;
    if (producer < 0 || static_cast<size_t>(producer) >= trace.kernels.size()) continue;
    const int from = trace.kernels[static_cast<size_t>(producer)].block, to = std::min(last_reader[i], blocks);
    if (from < 0 || to <= from) continue;
    change[static_cast<size_t>(from)] += trace.tensors[i].bytes;
    change[static_cast<size_t>(to)] -= trace.tensors[i].bytes;
  }
  std::vector<int64_t> cuts(static_cast<size_t>(std::max(blocks, 0)), 0);
  int64_t running = 0;
  for (size_t b = 0; b < cuts.size(); ++b) cuts[b] = running += change[b];
  return cuts;
}

int64_t stage_boundary_bytes(const ProfilePoint& point, int block, int64_t micro_batch) {
  if (block < 0 || static_cast<size_t>(block) >= point.cut_bytes.size()) return 0;
  const int64_t bytes = point.cut_bytes[static_cast<size_t>(block)];
  if (point.micro_batch <= 0) return bytes;
  return static_cast<int64_t>(static_cast<double>(bytes) * static_cast<double>(micro_batch) /
                              static_cast<double>(point.micro_batch));
}

void pipeline_terms(const ModelProfile& profile, const Machine& machine, const Plan& plan, double fb_ms,
                    Prediction& p) {
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
  const std::vector<BlockCost> costs = block_costs(profile, *pt, fb_ms, p.activation_bytes);
  PartitionOptions options;
  options.stages = parts;
  options.in_flight = in_flight_per_virtual_stage(kind, shape);  // as the trainer lays a pipeline out
  const Partition partition = balance_stages(costs, options);
  // A rank's time and memory are its chunks'.
  std::vector<double> rank_ms(static_cast<size_t>(plan.stages), 0);
  std::vector<int64_t> rank_peak(static_cast<size_t>(plan.stages), 0), rank_state(static_cast<size_t>(plan.stages), 0);
  for (int vs = 0; vs < parts; ++vs) {
    const StagePlan& s = partition.stages[static_cast<size_t>(vs)];
    const auto r = static_cast<size_t>(rank_of_virtual_stage(vs, shape));
    rank_ms[r] += s.ms;
    rank_peak[r] += s.peak_bytes;
    for (int b = s.first_block; b < s.first_block + s.blocks; ++b) rank_state[r] += costs[static_cast<size_t>(b)].state_bytes;
  }
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
  const PipelineSchedule schedule = make_schedule(kind, shape);
  const SimulationResult alone = simulate(schedule, shape, sim);
  sim.p2p = transfer_ms(machine, plan, cut_bytes);
  const SimulationResult run = sim.p2p > 0 ? simulate(schedule, shape, sim) : alone;
  p.compute_ms = run.makespan;
  p.bubble_ms = run.makespan * run.bubble;
  p.transfer_ms = std::max(0.0, run.makespan - alone.makespan);
  // Memory: the fullest rank. Activations replace one micro-batch's whole-model set.
  size_t fullest = 0;
  for (size_t r = 1; r < rank_peak.size(); ++r)
    if (rank_peak[r] > rank_peak[fullest]) fullest = r;
  // The rank's share of the blocks' state, each block's unsharded: at "optimizer" the state terms
  // are already the rank's share of the replica group's (planner/shard_terms.h), and a stage's
  // replicas split its state as a model's replicas split the model's.
  int64_t whole_state = 0;
  for (const BlockCost& c : costs) whole_state += c.state_bytes;
  const int64_t state = rank_state[fullest];
  const int64_t activations = rank_peak[fullest] - state;
  const double state_share = whole_state > 0 ? static_cast<double>(state) / static_cast<double>(whole_state) : 0;
  p.model_bytes = static_cast<int64_t>(static_cast<double>(p.model_bytes) * state_share);
  p.gradient_bytes = static_cast<int64_t>(static_cast<double>(p.gradient_bytes) * state_share);
  p.optimizer_state_bytes = static_cast<int64_t>(static_cast<double>(p.optimizer_state_bytes) * state_share);
  p.activation_bytes = activations;
  p.peak_bytes = p.model_bytes + p.gradient_bytes + p.optimizer_state_bytes + p.sampler_bytes + p.batch_bytes +
                 std::max(p.activation_bytes, p.optimizer_working_bytes);
  p.stage_imbalance = slowest / mean;
  p.stage_state_share = state_share;
}

}  // namespace ht

#include "parallel/pipeline_schedule.h"

#include <algorithm>
#include <stdexcept>

namespace ht {

bool operator==(const Action& a, const Action& b) {
  return a.kind == b.kind && a.micro_batch == b.micro_batch && a.chunk == b.chunk;
}
bool operator!=(const Action& a, const Action& b) { return !(a == b); }

namespace {

const char* kind_word(ActionKind kind) {
  switch (kind) {
    case ActionKind::kForward: return "forward";
    case ActionKind::kBackward: return "backward";
    case ActionKind::kBackwardInput: return "backward-input";
    case ActionKind::kBackwardWeight: return "backward-weight";
  }
  return "?";
}

// The next two multiples of `stages` from `m` up, for the refusal's "what would work".
std::string multiples_above(int m, int stages) {
  const int next = (m / stages + 1) * stages;
  return std::to_string(next) + " or " + std::to_string(next + stages);
}

}  // namespace

std::string schedule_refusal(ScheduleKind kind, ScheduleShape s) {
  const std::string name = choice_name(kind);
  if (s.stages < 1) return "a pipeline needs at least 1 stage, got " + std::to_string(s.stages);
  if (s.micro_batches < 1) return "a step needs at least 1 micro-batch, got " + std::to_string(s.micro_batches);
  if (s.virtual_stages < 1) return "virtual_stages must be at least 1, got " + std::to_string(s.virtual_stages);
  if (kind != ScheduleKind::kInterleaved1f1b) {
    if (s.virtual_stages == 1) return "";
    return "virtual_stages > 1 is only for interleaved_1f1b, got " + std::to_string(s.virtual_stages) + " for " +
           name + " (use virtual_stages = 1, or interleaved_1f1b)";
  }
  if (s.virtual_stages < 2)
    return "interleaved_1f1b needs virtual_stages >= 2 (model chunks per rank), got " +
           std::to_string(s.virtual_stages) + " (use 1f1b for one chunk per rank)";
  if (s.micro_batches % s.stages != 0)
    return "interleaved_1f1b needs micro-batches to be a multiple of the " + std::to_string(s.stages) + " stages (" +
           multiples_above(s.micro_batches, s.stages) + " would work), got " + std::to_string(s.micro_batches);
  return "";
}

int virtual_stage(int rank, int chunk, ScheduleShape s) { return chunk * s.stages + rank; }
int rank_of_virtual_stage(int vs, ScheduleShape s) { return vs % s.stages; }
int chunk_of_virtual_stage(int vs, ScheduleShape s) { return vs / s.stages; }

namespace {

using K = ActionKind;

std::vector<Action> gpipe_rank(ScheduleShape s) {
  std::vector<Action> out;
  for (int mb = 0; mb < s.micro_batches; ++mb) out.push_back({K::kForward, mb, 0});
  for (int mb = 0; mb < s.micro_batches; ++mb) out.push_back({K::kBackward, mb, 0});
  return out;
}

// PipeDream-flush: enough warmup forwards that the first backward finds its input gradient
// waiting, then one forward one backward, which caps the activations held at stages - r.
std::vector<Action> one_f_one_b_rank(int r, ScheduleShape s) {
  const int m = s.micro_batches, warmup = std::min(s.stages - r - 1, m);
  std::vector<Action> out;
  for (int mb = 0; mb < warmup; ++mb) out.push_back({K::kForward, mb, 0});
  for (int i = 0; i < m - warmup; ++i) {
    out.push_back({K::kForward, warmup + i, 0});
    out.push_back({K::kBackward, i, 0});
  }
  for (int mb = m - warmup; mb < m; ++mb) out.push_back({K::kBackward, mb, 0});
  return out;
}

// The k-th forward (or backward) of a rank in Megatron's interleaved order: micro-batches in
// groups of `stages`, each group through chunks 0..v-1 (forward) or v-1..0 (backward). Within a
// chunk micro-batches stay in increasing order, as gradient accumulation needs.
Action interleaved_action(int k, bool forward, ScheduleShape s) {
  const int p = s.stages, v = s.virtual_stages;
  const int group = k / (p * v), in_group = k % (p * v);
  const int chunk = forward ? in_group / p : v - 1 - in_group / p;
  return {forward ? K::kForward : K::kBackward, group * p + in_group % p, chunk};
}

// Megatron's warmup: (stages - r - 1) * 2 + (v - 1) * stages forwards, enough for the first
// backward of the last chunk to have come round; then 1F1B on the interleaved orders.
std::vector<Action> interleaved_rank(int r, ScheduleShape s) {
  const int total = s.micro_batches * s.virtual_stages;
  const int warmup = std::min((s.stages - r - 1) * 2 + (s.virtual_stages - 1) * s.stages, total);
  std::vector<Action> out;
  for (int k = 0; k < warmup; ++k) out.push_back(interleaved_action(k, true, s));
  for (int i = 0; i < total - warmup; ++i) {
    out.push_back(interleaved_action(warmup + i, true, s));
    out.push_back(interleaved_action(i, false, s));
  }
  for (int k = total - warmup; k < total; ++k) out.push_back(interleaved_action(k, false, s));
  return out;
}

// ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"): 1f1b's order with each backward
// split into its input half, sent on at once so the backward wave moves faster, and its weight
// half, which nobody waits for. Rank r keeps its last r weight halves pending (runs the oldest
// once more than r are): at the end of the step rank r would otherwise idle while the input
// gradients go from rank r down to rank 0, one backward-input per hop, and these r weight halves
// fill exactly that, so all ranks finish together. Rank r then holds at most
// min((stages - r) + r, m) = min(stages, m) micro-batches, 1f1b's peak on rank 0: the pipeline's
// peak memory is unchanged, later ranks just use the room 1f1b leaves them. With unit costs the
// bubble is (p-1)/(3m+p-1) (m >= p), the paper's (p-1)(F+B-W).
std::vector<Action> zb_h1_rank(int r, ScheduleShape s) {
  const int m = s.micro_batches, warmup = std::min(s.stages - r - 1, m);
  std::vector<Action> out;
  int next_w = 0;
  auto backward = [&](int mb) {
    out.push_back({K::kBackwardInput, mb, 0});
    for (; mb + 1 - next_w > r; ++next_w) out.push_back({K::kBackwardWeight, next_w, 0});
  };
  for (int mb = 0; mb < warmup; ++mb) out.push_back({K::kForward, mb, 0});
  for (int i = 0; i < m - warmup; ++i) {
    out.push_back({K::kForward, warmup + i, 0});
    backward(i);
  }
  for (int mb = m - warmup; mb < m; ++mb) backward(mb);
  for (; next_w < m; ++next_w) out.push_back({K::kBackwardWeight, next_w, 0});
  return out;
}

}  // namespace

PipelineSchedule make_schedule(ScheduleKind kind, ScheduleShape s) {
  const std::string refusal = schedule_refusal(kind, s);
  if (!refusal.empty()) throw std::invalid_argument(refusal);
  PipelineSchedule out;
  for (int r = 0; r < s.stages; ++r) {
    if (kind == ScheduleKind::kGpipe) out.push_back(gpipe_rank(s));
    if (kind == ScheduleKind::k1f1b) out.push_back(one_f_one_b_rank(r, s));
    if (kind == ScheduleKind::kInterleaved1f1b) out.push_back(interleaved_rank(r, s));
    if (kind == ScheduleKind::kZbH1) out.push_back(zb_h1_rank(r, s));
  }
  return out;
}

std::string describe(const Action& a) {
  return std::string(kind_word(a.kind)) + " of micro-batch " + std::to_string(a.micro_batch) + ", chunk " +
         std::to_string(a.chunk);
}

std::string schedule_to_string(const PipelineSchedule& schedule, ScheduleShape s) {
  std::string out;
  for (size_t r = 0; r < schedule.size(); ++r) {
    out += "rank " + std::to_string(r) + ":";
    for (const Action& a : schedule[r]) {
      const char letter = "FBbw"[static_cast<int>(a.kind)];
      out += std::string(" ") + letter + std::to_string(a.micro_batch);
      if (s.virtual_stages > 1) out += "." + std::to_string(a.chunk);
    }
    out += "\n";
  }
  return out;
}

// ---- check_schedule ------------------------------------------------------------------------

namespace {

// What check_schedule has seen of one (micro-batch, chunk) on one rank.
struct Seen {
  bool forward = false, grad_input = false, weight = false;
};

// Last micro-batch whose input / weight gradient part ran, per chunk: they must increase.
struct ChunkOrder {
  std::vector<int> last_input, last_weight;
};

// "" or what is wrong with action `a` given what came before it on the rank.
std::string check_action(const Action& a, Seen& seen, ChunkOrder& order) {
  const bool forward = a.kind == K::kForward;
  const bool input_part = a.kind == K::kBackward || a.kind == K::kBackwardInput;
  const bool weight_part = a.kind == K::kBackward || a.kind == K::kBackwardWeight;
  if (forward && seen.forward) return "a second forward";
  if (!forward && !seen.forward) return "comes before its forward";
  if (input_part && seen.grad_input) return "a second backward (input gradients already done)";
  if (a.kind == K::kBackwardWeight && !seen.grad_input) return "comes before its backward-input";
  if (weight_part && seen.weight) return "a second backward (weight gradients already done)";
  int& last_input = order.last_input[a.chunk];
  int& last_weight = order.last_weight[a.chunk];
  if (input_part && a.micro_batch < last_input)
    return "input gradients out of micro-batch order (micro-batch " + std::to_string(last_input) + " came first)";
  if (weight_part && a.micro_batch < last_weight)
    return "weight gradients out of micro-batch order (micro-batch " + std::to_string(last_weight) +
           " came first), which would change how gradients accumulate";
  seen.forward |= forward;
  seen.grad_input |= input_part;
  seen.weight |= weight_part;
  if (input_part) last_input = a.micro_batch;
  if (weight_part) last_weight = a.micro_batch;
  return "";
}

std::string check_rank(const std::vector<Action>& actions, int r, ScheduleShape s) {
  const int m = s.micro_batches, v = s.virtual_stages;
  std::vector<Seen> seen(static_cast<size_t>(m) * v);
  ChunkOrder order{std::vector<int>(v, -1), std::vector<int>(v, -1)};
  const std::string where = "rank " + std::to_string(r);
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    const std::string what = where + ", action " + std::to_string(i) + " (" + describe(a) + "): ";
    if (a.micro_batch < 0 || a.micro_batch >= m) return what + "micro-batch out of range 0.." + std::to_string(m - 1);
    if (a.chunk < 0 || a.chunk >= v) return what + "chunk out of range 0.." + std::to_string(v - 1);
    const std::string problem = check_action(a, seen[a.micro_batch * v + a.chunk], order);
    if (!problem.empty()) return what + problem;
  }
  for (int mb = 0; mb < m; ++mb)
    for (int c = 0; c < v; ++c) {
      const Seen& x = seen[mb * v + c];
      const char* missing = !x.forward      ? "forward"
                            : !x.grad_input ? "backward"
                            : !x.weight     ? "backward-weight"
                                            : nullptr;
      if (missing)
        return where + " never runs the " + missing + " of micro-batch " + std::to_string(mb) + ", chunk " +
               std::to_string(c);
    }
  return "";
}

}  // namespace

std::string check_schedule(const PipelineSchedule& schedule, ScheduleShape s) {
  if (static_cast<int>(schedule.size()) != s.stages)
    return "the schedule has " + std::to_string(schedule.size()) + " ranks for " + std::to_string(s.stages) +
           " stages";
  for (int r = 0; r < s.stages; ++r) {
    std::string problem = check_rank(schedule[r], r, s);
    if (!problem.empty()) return problem;
  }
  return "";
}

// ---- simulate ------------------------------------------------------------------------------

namespace {

// Something an action waits for: the forward output or the input gradient (of a kBackward or a
// kBackwardInput) of a micro-batch at a virtual stage.
struct Need {
  bool gradient = false;
  int micro_batch = 0, vs = 0;
};

struct SimState {
  ScheduleShape shape;
  std::vector<double> forward_end, gradient_end;  // [vs * m + mb]; < 0 while not done
  std::vector<size_t> next;                       // per rank: index of its next action
  std::vector<double> free_at;
  double& end_of(const Need& n) {
    return (n.gradient ? gradient_end : forward_end)[n.vs * shape.micro_batches + n.micro_batch];
  }
};

std::vector<Need> needs_of(const Action& a, int rank, ScheduleShape s) {
  const int vs = virtual_stage(rank, a.chunk, s), last = s.stages * s.virtual_stages - 1;
  if (a.kind == K::kForward) {
    if (vs == 0) return {};
    return {{false, a.micro_batch, vs - 1}};
  }
  if (a.kind == K::kBackwardWeight) return {{true, a.micro_batch, vs}};
  std::vector<Need> needs{{false, a.micro_batch, vs}};
  if (vs < last) needs.push_back({true, a.micro_batch, vs + 1});
  return needs;
}

}  // namespace

double action_cost(const Action& a, int rank, const SimulationCosts& c) {
  const double scale = rank < static_cast<int>(c.stage_scale.size()) ? c.stage_scale[rank] : 1.0;
  switch (a.kind) {
    case K::kForward: return scale * c.forward;
    case K::kBackward: return scale * (c.backward_input + c.backward_weight);
    case K::kBackwardInput: return scale * c.backward_input;
    case K::kBackwardWeight: return scale * c.backward_weight;
  }
  return 0;
}

namespace {

// When rank r's next action may start, or -1 while something it needs has not finished.
double ready_at(SimState& st, const Action& a, int r, double p2p) {
  double t = st.free_at[r];
  for (const Need& n : needs_of(a, r, st.shape)) {
    const double end = st.end_of(n);
    if (end < 0) return -1;
    t = std::max(t, end + (rank_of_virtual_stage(n.vs, st.shape) == r ? 0.0 : p2p));
  }
  return t;
}

// Where the producer of `n` sits and why it never runs, for the deadlock message.
std::string why_never(const PipelineSchedule& schedule, const SimState& st, const Need& n) {
  const int q = rank_of_virtual_stage(n.vs, st.shape), chunk = chunk_of_virtual_stage(n.vs, st.shape);
  const std::vector<Action>& list = schedule[q];
  for (size_t i = st.next[q]; i < list.size(); ++i) {
    const Action& a = list[i];
    const bool makes = n.gradient ? (a.kind == K::kBackward || a.kind == K::kBackwardInput) : a.kind == K::kForward;
    if (!makes || a.micro_batch != n.micro_batch || a.chunk != chunk) continue;
    return "rank " + std::to_string(q) + " has it as action " + std::to_string(i) + " but is stuck at action " +
           std::to_string(st.next[q]) + " (" + describe(list[st.next[q]]) + ")";
  }
  return "no rank " + std::to_string(q) + " action left produces it";
}

std::string deadlock_message(const PipelineSchedule& schedule, SimState& st) {
  for (int r = 0; r < st.shape.stages; ++r) {
    if (st.next[r] >= schedule[r].size()) continue;
    const Action& a = schedule[r][st.next[r]];
    for (const Need& n : needs_of(a, r, st.shape)) {
      if (st.end_of(n) >= 0) continue;
      const Action producer{n.gradient ? K::kBackward : K::kForward, n.micro_batch,
                            chunk_of_virtual_stage(n.vs, st.shape)};
      std::string what = n.gradient ? "input gradient (backward) of micro-batch " + std::to_string(n.micro_batch) +
                                          ", chunk " + std::to_string(producer.chunk)
                                    : describe(producer);
      return "rank " + std::to_string(r) + " waits forever for " + what + " (for its " + describe(a) +
             "): " + why_never(schedule, st, n);
    }
  }
  return "deadlock";
}

std::string range_error(const PipelineSchedule& schedule, ScheduleShape s) {
  if (static_cast<int>(schedule.size()) != s.stages)
    return "the schedule has " + std::to_string(schedule.size()) + " ranks for " + std::to_string(s.stages) +
           " stages";
  for (size_t r = 0; r < schedule.size(); ++r)
    for (const Action& a : schedule[r])
      if (a.micro_batch < 0 || a.micro_batch >= s.micro_batches || a.chunk < 0 || a.chunk >= s.virtual_stages)
        return "rank " + std::to_string(r) + ": " + describe(a) + " is out of range";
  return "";
}

}  // namespace

int peak_in_flight(const std::vector<Action>& actions) {
  int held = 0, peak = 0;
  for (const Action& a : actions) {
    if (a.kind == K::kForward) ++held;
    if (a.kind == K::kBackward || a.kind == K::kBackwardWeight) --held;
    peak = std::max(peak, held);
  }
  return peak;
}

namespace {

// Runs every rank as far as it can until nobody can move; true when all finished.
bool play(const PipelineSchedule& schedule, SimState& st, const SimulationCosts& costs, SimulationResult& res) {
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < st.shape.stages; ++r) {
      for (size_t& i = st.next[r]; i < schedule[r].size(); ++i) {
        const Action& a = schedule[r][i];
        const double start = ready_at(st, a, r, costs.p2p);
        if (start < 0) break;
        const double cost = action_cost(a, r, costs);
        res.start[r][i] = start;
        res.busy[r] += cost;
        st.free_at[r] = start + cost;
        const int vs = virtual_stage(r, a.chunk, st.shape);
        if (a.kind == K::kForward) st.end_of({false, a.micro_batch, vs}) = start + cost;
        if (a.kind == K::kBackward || a.kind == K::kBackwardInput) st.end_of({true, a.micro_batch, vs}) = start + cost;
        moved = true;
      }
    }
  }
  for (int r = 0; r < st.shape.stages; ++r)
    if (st.next[r] < schedule[r].size()) return false;
  return true;
}

}  // namespace

SimulationResult simulate(const PipelineSchedule& schedule, ScheduleShape s, SimulationCosts costs) {
  SimulationResult res;
  res.error = range_error(schedule, s);
  if (!res.error.empty()) return res;
  const size_t cells = static_cast<size_t>(s.stages) * s.virtual_stages * s.micro_batches;
  SimState st{s, std::vector<double>(cells, -1), std::vector<double>(cells, -1),
              std::vector<size_t>(s.stages, 0), std::vector<double>(s.stages, 0)};
  res.busy.assign(s.stages, 0);
  for (const auto& list : schedule) {
    res.start.emplace_back(list.size(), -1);
    res.peak_in_flight.push_back(peak_in_flight(list));
  }
  if (!play(schedule, st, costs, res)) {
    res.deadlock = true;
    res.error = deadlock_message(schedule, st);
  }
  res.makespan = *std::max_element(st.free_at.begin(), st.free_at.end());
  double busy = 0;
  for (double b : res.busy) busy += b;
  if (res.makespan > 0) res.bubble = 1 - busy / (s.stages * res.makespan);
  return res;
}

double theoretical_bubble(ScheduleKind kind, ScheduleShape s) {
  const double p = s.stages, m = s.micro_batches, v = s.virtual_stages;
  switch (kind) {
    case ScheduleKind::kGpipe:
    case ScheduleKind::k1f1b: return (p - 1) / (m + p - 1);
    case ScheduleKind::kInterleaved1f1b: return (p - 1) / (v * m + p - 1);
    case ScheduleKind::kZbH1: return (p - 1) / (3 * m + p - 1);
  }
  return 0;
}

std::vector<int> in_flight_per_virtual_stage(ScheduleKind kind, ScheduleShape shape) {
  const SimulationResult sim = simulate(make_schedule(kind, shape), shape);
  std::vector<int> counts(static_cast<size_t>(shape.stages * shape.virtual_stages), 1);
  for (int vs = 0; vs < static_cast<int>(counts.size()); ++vs) {
    const int peak = sim.peak_in_flight[static_cast<size_t>(rank_of_virtual_stage(vs, shape))];
    counts[static_cast<size_t>(vs)] = std::max(1, (peak + shape.virtual_stages - 1) / shape.virtual_stages);
  }
  return counts;
}

}  // namespace ht

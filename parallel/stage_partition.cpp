#include "parallel/stage_partition.h"
#include "base/printf_string.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <functional>
#include <limits>
#include <stdexcept>

namespace ht {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kMiB = 1024.0 * 1024.0;

std::string mib(int64_t bytes) { return printf_string("%.1f MiB", static_cast<double>(bytes) / kMiB); }

// Rounded up to the printed 0.1 MiB: a limit suggested by an error message must really fit.
std::string mib_rounded_up(int64_t bytes) {
  return printf_string("%.1f MiB", std::ceil(static_cast<double>(bytes) / kMiB * 10.0) / 10.0);
}

std::string plural(int64_t count, const char* word) {
  return std::to_string(count) + " " + word + (count == 1 ? "" : "s");
}

// The blocks' costs as range sums. A stage's ms is summed block by block from its first block
// (not as a difference of prefix sums): every caller, the DP and the plan it returns, then sees
// the very same double for the same range, so comparing against the optimum is exact.
class RangeCosts {
 public:
  explicit RangeCosts(const std::vector<BlockCost>& blocks) : n_(static_cast<int>(blocks.size())) {
    ms_.assign(static_cast<size_t>(n_) * (n_ + 1), 0.0);
    activation_.assign(n_ + 1, 0);
    state_.assign(n_ + 1, 0);
    parameters_.assign(n_ + 1, 0);
    for (int i = 0; i < n_; ++i) {
      const BlockCost& b = blocks[i];
      activation_[i + 1] = activation_[i] + b.activation_bytes;
      state_[i + 1] = state_[i] + b.state_bytes;
      parameters_[i + 1] = parameters_[i] + b.parameters;
      double sum = 0;
      for (int j = i; j < n_; ++j) {
        sum += blocks[j].forward_ms + blocks[j].backward_ms;
        ms_[static_cast<size_t>(i) * (n_ + 1) + j + 1] = sum;
      }
    }
  }
  int size() const { return n_; }
  // Blocks [first, end).
  double ms(int first, int end) const { return ms_[static_cast<size_t>(first) * (n_ + 1) + end]; }
  int64_t parameters(int first, int end) const { return parameters_[end] - parameters_[first]; }
  int64_t peak(int first, int end, int in_flight) const {
    return state_[end] - state_[first] + (activation_[end] - activation_[first]) * in_flight;
  }

 private:
  int n_;
  std::vector<double> ms_;  // ms_[first * (n + 1) + end]
  std::vector<int64_t> activation_, state_, parameters_;  // prefix sums: exact in integers
};

void check_costs(const std::vector<BlockCost>& blocks) {
  for (size_t i = 0; i < blocks.size(); ++i) {
    const BlockCost& b = blocks[i];
    // !(x >= 0) also catches NaN, which would make every comparison of the DP false.
    if (!(b.forward_ms >= 0) || !(b.backward_ms >= 0) || b.activation_bytes < 0 || b.state_bytes < 0 ||
        b.parameters < 0)
      throw std::invalid_argument("block " + std::to_string(i) + " ('" + b.name +
                                  "') has a negative or NaN cost: profiled costs must be >= 0");
  }
}

void check_stage_count(int n, int stages) {
  if (stages < 1)
    throw std::invalid_argument("pipeline stages must be >= 1 (got " + std::to_string(stages) + ")");
  if (stages > n)
    throw std::invalid_argument(plural(n, "block") + " cannot make " + plural(stages, "stage") + ": at most " +
                                plural(n, "stage") + ", or a model with more blocks");
}

// options.in_flight, or 1 per stage when empty.
std::vector<int> resolve_in_flight(const PartitionOptions& options) {
  if (options.in_flight.empty()) return std::vector<int>(options.stages, 1);
  if (static_cast<int>(options.in_flight.size()) != options.stages)
    throw std::invalid_argument(std::to_string(options.in_flight.size()) + " in-flight counts for " +
                                plural(options.stages, "stage") + ": give one per stage, or none for 1 each");
  for (size_t s = 0; s < options.in_flight.size(); ++s)
    if (options.in_flight[s] < 1)
      throw std::invalid_argument("stage " + std::to_string(s) + " has " + std::to_string(options.in_flight[s]) +
                                  " micro-batches in flight: every stage holds at least 1");
  return options.in_flight;
}

// What every entry point checks first; returns the resolved in-flight counts.
std::vector<int> validate(const std::vector<BlockCost>& blocks, const PartitionOptions& options) {
  check_costs(blocks);
  check_stage_count(static_cast<int>(blocks.size()), options.stages);
  if (options.memory_limit_bytes < 0)
    throw std::invalid_argument("memory_limit_bytes must be >= 0 (0: unlimited)");
  return resolve_in_flight(options);
}

// The cost of stage `stage` holding blocks [first, end); kInf: not allowed.
using StageCost = std::function<double(int stage, int first, int end)>;
using Table = std::vector<std::vector<double>>;

// best[s][i]: over the splits of blocks [i, n) into stages s..stages-1 (>= 1 block each), the
// smallest possible largest stage cost; kInf where there is none. Suffixes rather than prefixes
// so that earliest_cut_counts() can walk forward from stage 0. O(stages * n^2) cost calls.
Table suffix_minmax(int n, int stages, const StageCost& cost) {
  Table best(stages + 1, std::vector<double>(n + 1, kInf));
  best[stages][n] = -kInf;  // no stage left and no block left: nothing to take the max of
  for (int s = stages - 1; s >= 0; --s) {
    const int later = stages - 1 - s;  // stages after s, each needing a block
    for (int i = s; i + 1 + later <= n; ++i) {
      double value = kInf;
      for (int end = i + 1; end + later <= n; ++end) {
        if (best[s + 1][end] >= value) continue;  // cannot improve: skip the cost call
        value = std::min(value, std::max(cost(s, i, end), best[s + 1][end]));
      }
      best[s][i] = value;
    }
  }
  return best;
}

// Blocks per stage of the split with every stage cost <= bound (bound = best[0][0] or more) whose
// cuts come earliest: each stage takes the fewest blocks that still leave a feasible rest.
// Makes ties deterministic, and independent of the order in which the DP met them.
std::vector<int> earliest_cut_counts(int n, int stages, const StageCost& cost, const Table& best, double bound) {
  std::vector<int> counts;
  int first = 0;
  for (int s = 0; s < stages; ++s) {
    const int later = stages - 1 - s;
    int end = first + 1;
    while (end + later <= n && !(cost(s, first, end) <= bound && best[s + 1][end] <= bound)) ++end;
    if (end + later > n) throw std::logic_error("stage partition: no split within the DP's optimum");
    counts.push_back(end - first);
    first = end;
  }
  return counts;
}

Partition build_partition(const RangeCosts& costs, const std::vector<int>& counts, const std::vector<int>& in_flight) {
  Partition p;
  int first = 0;
  double total_ms = 0;
  for (size_t s = 0; s < counts.size(); ++s) {
    StagePlan stage;
    stage.first_block = first;
    stage.blocks = counts[s];
    const int end = first + counts[s];
    stage.ms = costs.ms(first, end);
    stage.peak_bytes = costs.peak(first, end, in_flight[s]);
    stage.parameters = costs.parameters(first, end);
    p.slowest_ms = std::max(p.slowest_ms, stage.ms);
    total_ms += stage.ms;
    p.stages.push_back(stage);
    first = end;
  }
  p.mean_ms = counts.empty() ? 0 : total_ms / static_cast<double>(counts.size());
  return p;
}

// Peaks as doubles for the DP: exact below 2^53 bytes (8 PiB), far beyond any stage.
StageCost peak_cost(const RangeCosts& costs, const std::vector<int>& in_flight) {
  return [&costs, &in_flight](int s, int first, int end) {
    return static_cast<double>(costs.peak(first, end, in_flight[s]));
  };
}

// Fewest stages, 1 micro-batch in flight each, whose peaks fit `limit`; 0 when a block alone
// does not. Greedy packing is optimal here: a stage's peak only grows as it takes more blocks.
int fewest_stages_fitting(const RangeCosts& costs, int64_t limit) {
  int stages = 0;
  for (int first = 0; first < costs.size();) {
    int end = first;
    while (end < costs.size() && costs.peak(first, end + 1, 1) <= limit) ++end;
    if (end == first) return 0;
    ++stages;
    first = end;
  }
  return stages;
}

std::string join(const std::vector<int>& values) {
  std::string s;
  for (size_t i = 0; i < values.size(); ++i) s += (i ? ", " : "") + std::to_string(values[i]);
  return s;
}

[[noreturn]] void throw_no_fit(const std::vector<BlockCost>& blocks, const RangeCosts& costs,
                               const PartitionOptions& options, const std::vector<int>& in_flight) {
  const int n = costs.size();
  const int64_t smallest = static_cast<int64_t>(suffix_minmax(n, options.stages, peak_cost(costs, in_flight))[0][0]);
  std::string message = "no split of " + plural(n, "block") + " into " + plural(options.stages, "stage") +
                        " fits the memory limit of " + mib(options.memory_limit_bytes) +
                        " per stage (micro-batches in flight per stage: " + join(in_flight) +
                        "): the smallest limit that fits is " + mib_rounded_up(smallest) + " (" +
                        std::to_string(smallest) + " bytes)";
  if (options.in_flight.empty()) {
    const int fewest = fewest_stages_fitting(costs, options.memory_limit_bytes);
    if (fewest > 0) {
      message += "; or " + plural(fewest, "stage") + " would fit this limit";
    } else {
      int heaviest = 0;  // the block that no number of stages can relieve
      for (int i = 1; i < n; ++i)
        if (costs.peak(i, i + 1, 1) > costs.peak(heaviest, heaviest + 1, 1)) heaviest = i;
      message += "; more stages cannot help: block '" + blocks[heaviest].name + "' alone needs " +
                 mib_rounded_up(costs.peak(heaviest, heaviest + 1, 1));
    }
  } else {
    message += "; more stages (fewer blocks each) or fewer micro-batches in flight may also fit it";
  }
  throw std::invalid_argument(message);
}

}  // namespace

std::vector<int> one_f_one_b_in_flight(int stages, int micro_batches) {
  if (stages < 1 || micro_batches < 1)
    throw std::invalid_argument("1F1B in-flight counts need stages >= 1 and micro_batches >= 1");
  std::vector<int> in_flight(stages);
  for (int s = 0; s < stages; ++s) in_flight[s] = std::min(stages - s, micro_batches);
  return in_flight;
}

std::vector<int> gpipe_in_flight(int stages, int micro_batches) {
  if (stages < 1 || micro_batches < 1)
    throw std::invalid_argument("GPipe in-flight counts need stages >= 1 and micro_batches >= 1");
  return std::vector<int>(stages, micro_batches);
}

Partition balance_stages(const std::vector<BlockCost>& blocks, const PartitionOptions& options) {
  const std::vector<int> in_flight = validate(blocks, options);
  const RangeCosts costs(blocks);
  const int n = costs.size(), stages = options.stages;
  const int64_t limit = options.memory_limit_bytes;
  auto fits = [&](int s, int first, int end) { return limit == 0 || costs.peak(first, end, in_flight[s]) <= limit; };

  // Pass 1: the smallest slowest stage among the splits that fit.
  const StageCost time = [&](int s, int first, int end) { return fits(s, first, end) ? costs.ms(first, end) : kInf; };
  const double slowest = suffix_minmax(n, stages, time)[0][0];
  if (slowest == kInf) throw_no_fit(blocks, costs, options, in_flight);

  // Pass 2: among those (every stage within `slowest`), the smallest largest peak. A second DP
  // rather than comparing (ms, peak) pairs in one: the lexicographic order of maxima has no
  // optimal substructure (a prefix with a worse ms but a lower peak can win once a slower stage follows).
  const StageCost peak = [&](int s, int first, int end) {
    if (!fits(s, first, end) || costs.ms(first, end) > slowest) return kInf;
    return static_cast<double>(costs.peak(first, end, in_flight[s]));
  };
  const Table best = suffix_minmax(n, stages, peak);
  return build_partition(costs, earliest_cut_counts(n, stages, peak, best, best[0][0]), in_flight);
}

Partition balance_stages(const std::vector<std::vector<BlockCost>>& at_stage, const PartitionOptions& options) {
  if (static_cast<int>(at_stage.size()) != options.stages)
    throw std::invalid_argument("balance_stages: one cost list per stage (" + std::to_string(at_stage.size()) + " for " +
                                plural(options.stages, "stage") + ")");
  std::vector<RangeCosts> costs;
  std::vector<int> in_flight;
  for (const std::vector<BlockCost>& blocks : at_stage) {
    in_flight = validate(blocks, options);
    if (blocks.size() != at_stage[0].size())
      throw std::invalid_argument("balance_stages: every stage's cost list covers every block");
    costs.emplace_back(blocks);
  }
  const int n = costs[0].size(), stages = options.stages;
  const int64_t limit = options.memory_limit_bytes;
  auto fits = [&](int s, int first, int end) { return limit == 0 || costs[s].peak(first, end, in_flight[s]) <= limit; };
  // As the one-list DP: the smallest slowest stage, then the smallest largest peak among those.
  const StageCost time = [&](int s, int first, int end) { return fits(s, first, end) ? costs[s].ms(first, end) : kInf; };
  const double slowest = suffix_minmax(n, stages, time)[0][0];
  if (slowest == kInf) throw_no_fit(at_stage[0], costs[0], options, in_flight);
  const StageCost peak = [&](int s, int first, int end) {
    if (!fits(s, first, end) || costs[s].ms(first, end) > slowest) return kInf;
    return static_cast<double>(costs[s].peak(first, end, in_flight[s]));
  };
  const Table best = suffix_minmax(n, stages, peak);
  const std::vector<int> counts = earliest_cut_counts(n, stages, peak, best, best[0][0]);
  // Each stage's figures from its own list.
  Partition p;
  double total = 0;
  int first = 0;
  for (int s = 0; s < stages; ++s) {
    StagePlan stage;
    const int end = first + counts[s];
    stage.first_block = first;
    stage.blocks = counts[s];
    stage.ms = costs[s].ms(first, end);
    stage.peak_bytes = costs[s].peak(first, end, in_flight[s]);
    stage.parameters = costs[s].parameters(first, end);
    p.slowest_ms = std::max(p.slowest_ms, stage.ms);
    total += stage.ms;
    p.stages.push_back(stage);
    first += counts[s];
  }
  p.mean_ms = total / stages;
  return p;
}

Partition partition_by_parameters(const std::vector<BlockCost>& blocks, const PartitionOptions& options) {
  const std::vector<int> in_flight = validate(blocks, options);
  const RangeCosts costs(blocks);
  const int n = costs.size(), stages = options.stages;
  // Parameter counts as doubles: exact below 2^53.
  const StageCost params = [&](int, int first, int end) { return static_cast<double>(costs.parameters(first, end)); };
  const Table best = suffix_minmax(n, stages, params);
  return build_partition(costs, earliest_cut_counts(n, stages, params, best, best[0][0]), in_flight);
}

Partition partition_from_counts(const std::vector<BlockCost>& blocks, const std::vector<int>& blocks_per_stage,
                                const PartitionOptions& options) {
  check_costs(blocks);
  if (options.stages < 1)
    throw std::invalid_argument("pipeline stages must be >= 1 (got " + std::to_string(options.stages) + ")");
  const int n = static_cast<int>(blocks.size());
  if (static_cast<int>(blocks_per_stage.size()) != options.stages)
    throw std::invalid_argument("parallel.stage_blocks gives " + plural(blocks_per_stage.size(), "count") + " for " +
                                plural(options.stages, "stage") + ": give one count per stage (" +
                                std::to_string(options.stages) + " numbers summing to " + std::to_string(n) + ")");
  int64_t sum = 0;
  for (size_t s = 0; s < blocks_per_stage.size(); ++s) {
    if (blocks_per_stage[s] < 1)
      throw std::invalid_argument("parallel.stage_blocks gives stage " + std::to_string(s) + " " +
                                  std::to_string(blocks_per_stage[s]) + " blocks: every stage needs at least 1 block");
    sum += blocks_per_stage[s];
  }
  if (sum != n)
    throw std::invalid_argument("parallel.stage_blocks sums to " + std::to_string(sum) + " but the model has " +
                                plural(n, "block") + ": the counts must sum to " + std::to_string(n));
  const std::vector<int> in_flight = validate(blocks, options);
  return build_partition(RangeCosts(blocks), blocks_per_stage, in_flight);
}

std::vector<int> stage_block_counts(const Partition& partition) {
  std::vector<int> counts;
  for (const StagePlan& stage : partition.stages) counts.push_back(stage.blocks);
  return counts;
}

int64_t smallest_stage_limit_bytes(const std::vector<BlockCost>& blocks, const PartitionOptions& options) {
  const std::vector<int> in_flight = validate(blocks, options);
  const RangeCosts costs(blocks);
  return static_cast<int64_t>(suffix_minmax(costs.size(), options.stages, peak_cost(costs, in_flight))[0][0]);
}

namespace {

// "12", "350.0K", "1.2M", "7.0B": the magnitude is what a reader compares between stages.
std::string count_text(int64_t count) {
  const double c = static_cast<double>(count);
  if (count < 1000) return std::to_string(count);
  if (count < 1000000) return printf_string("%.1fK", c / 1e3);
  if (count < 1000000000) return printf_string("%.1fM", c / 1e6);
  return printf_string("%.1fB", c / 1e9);
}

std::string block_name(const std::vector<BlockCost>& blocks, int i) {
  return blocks[i].name.empty() ? "#" + std::to_string(i) : blocks[i].name;
}

std::string range_text(const std::vector<BlockCost>& blocks, const StagePlan& stage) {
  const int last = stage.first_block + stage.blocks - 1;
  if (stage.first_block < 0 || stage.blocks < 1 || last >= static_cast<int>(blocks.size()))
    throw std::invalid_argument("format_stage_table: a stage's blocks lie outside the model's " +
                                plural(blocks.size(), "block") + ": was the partition made for another model?");
  if (stage.blocks == 1) return block_name(blocks, stage.first_block);
  return block_name(blocks, stage.first_block) + ".." + block_name(blocks, last);
}

}  // namespace

std::string format_stage_table(const std::vector<BlockCost>& blocks, const Partition& partition) {
  std::vector<std::string> ranges;
  int width = 6;  // "blocks"
  for (const StagePlan& stage : partition.stages) {
    ranges.push_back(range_text(blocks, stage));
    width = std::max(width, static_cast<int>(ranges.back().size()));
  }
  std::string table = printf_string("stage  %-*s  count  parameters  ms/micro-batch  peak MiB\n", width, "blocks");
  for (size_t s = 0; s < partition.stages.size(); ++s) {
    const StagePlan& stage = partition.stages[s];
    table += printf_string("%5zu  %-*s  %5d  %10s  %14.2f  %8.1f\n", s, width, ranges[s].c_str(), stage.blocks,
                           count_text(stage.parameters).c_str(), stage.ms,
                           static_cast<double>(stage.peak_bytes) / kMiB);
  }
  const double ratio = partition.mean_ms > 0 ? partition.slowest_ms / partition.mean_ms : 1.0;
  table += printf_string("slowest %.2f ms / mean %.2f ms per micro-batch: slowest/mean %.2f\n", partition.slowest_ms,
                         partition.mean_ms, ratio);
  return table;
}

}  // namespace ht

#include "schedule/block_plan.h"

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string_view>

namespace ht::schedule {
namespace {

// More nodes than a block of tens of saved values needs once bounded; beyond it the best found is
// returned and said inexact.
constexpr int64_t kNodeLimit = 4'000'000;

class Search {
 public:
  Search(const BlockGraph& g, int64_t budget, const BlockLink& link) : g_(g), budget_(budget), link_(link) {
    for (size_t v = 0; v < g.values.size(); ++v)
      if (g.values[v].saved) order_.push_back(static_cast<int>(v));
    std::stable_sort(order_.begin(), order_.end(),
                     [&](int a, int b) { return g.values[a].bytes > g.values[b].bytes; });
    rest_bytes_.assign(order_.size() + 1, 0);
    for (size_t i = order_.size(); i-- > 0;) rest_bytes_[i] = rest_bytes_[i + 1] + g.values[order_[i]].bytes;
    keep_.assign(g.values.size(), false);
    offload_.assign(g.values.size(), false);
    best_ = plan_with(g, keep_, offload_, link_);  // keep nothing: always within budget
  }

  BlockPlan run() {
    visit(0, 0, 0);
    best_.exact = nodes_ <= kNodeLimit;
    return best_;
  }

 private:
  void visit(size_t i, int64_t kept, int64_t offloaded) {
    if (++nodes_ > kNodeLimit) return;
    // Keeping every undecided value is the least this branch can cost: more values at hand never
    // regenerate more, and the link's time only grows with what it carries.
    for (size_t j = i; j < order_.size(); ++j) keep_[order_[j]] = true;
    BlockPlan bound = plan_with(g_, keep_, offload_, link_);
    for (size_t j = i; j < order_.size(); ++j) keep_[order_[j]] = false;
    const bool all_fit = kept + rest_bytes_[i] <= budget_;
    if (all_fit || bound.cost_ms() >= best_.cost_ms()) {
      if (all_fit && bound.cost_ms() < best_.cost_ms()) best_ = std::move(bound);
      return;
    }
    const int v = order_[i];
    const int64_t bytes = g_.values[v].bytes;
    if (kept + bytes <= budget_) {
      keep_[v] = true;
      visit(i + 1, kept + bytes, offloaded);
      keep_[v] = false;
    }
    if (link_.on() && bytes >= link_.min_bytes && offloaded + bytes <= link_.host_bytes) {
      offload_[v] = true;
      visit(i + 1, kept, offloaded + bytes);
      offload_[v] = false;
    }
    visit(i + 1, kept, offloaded);
  }

  const BlockGraph& g_;
  const int64_t budget_;
  const BlockLink link_;
  std::vector<int> order_;         // saved values, largest first
  std::vector<int64_t> rest_bytes_;  // bytes of order_[i..]
  std::vector<bool> keep_, offload_;
  BlockPlan best_;
  int64_t nodes_ = 0;
};

}  // namespace

int64_t BlockGraph::saved_bytes() const {
  int64_t n = 0;
  for (const BlockValue& v : values)
    if (v.saved) n += v.bytes;
  return n;
}

std::string BlockGraph::signature() const {
  std::string s;
  char buf[64];
  for (const BlockOp& op : ops) {
    std::snprintf(buf, sizeof buf, ":%.9g:", op.cost_ms);
    s += op.name;
    s += buf;
    for (int in : op.inputs) s += std::to_string(in) + ",";
  }
  for (const BlockValue& v : values) s += "v" + std::to_string(v.bytes) + ":" + std::to_string(v.op) + (v.saved ? "s" : "");
  return s;
}

double unhidden_link_ms(const BlockGraph& graph, const BlockLink& link, int64_t bytes) {
  if (bytes <= 0) return 0;
  double forward_ms = 0;
  for (const BlockOp& op : graph.ops) forward_ms += op.cost_ms;
  const double copy_ms = static_cast<double>(bytes) * link.ms_per_byte;
  return std::max(0.0, copy_ms - forward_ms) + std::max(0.0, copy_ms - link.backward_factor * forward_ms);
}

BlockPlan plan_with(const BlockGraph& graph, std::vector<bool> keep, std::vector<bool> offload, const BlockLink& link) {
  BlockPlan plan;
  keep.resize(graph.values.size(), false);
  offload.resize(graph.values.size(), false);
  std::vector<bool> run(graph.ops.size(), false);
  std::vector<int> needed;
  for (size_t v = 0; v < graph.values.size(); ++v) {
    if (!graph.values[v].saved) keep[v] = false;
    if (!graph.values[v].saved || keep[v]) offload[v] = false;
    if (keep[v]) plan.kept_bytes += graph.values[v].bytes;
    if (offload[v]) plan.offload_bytes += graph.values[v].bytes;
    if (graph.values[v].saved && !keep[v] && !offload[v]) needed.push_back(static_cast<int>(v));
  }
  while (!needed.empty()) {
    const int v = needed.back();
    needed.pop_back();
    const int op = graph.values[v].op;
    if (run[op]) continue;
    run[op] = true;
    ++plan.recomputed_ops;
    for (int in : graph.ops[op].inputs)
      if (!keep[in] && !offload[in]) needed.push_back(in);
  }
  // Summed in op order: the same ops rerun cost the same, to the bit, whatever the walk's order.
  for (size_t o = 0; o < run.size(); ++o)
    if (run[o]) plan.recompute_ms += graph.ops[o].cost_ms;
  plan.link_ms = unhidden_link_ms(graph, link, plan.offload_bytes);
  plan.keep = std::move(keep);
  plan.offload = std::move(offload);
  plan.rerun = std::move(run);
  return plan;
}

namespace {

// Of a least-cost plan, the kept values whose drop costs nothing more, dropped (largest first): a
// value whose op runs again anyway (another output of it is dropped: attention's output and its
// statistics) is bytes for nothing. Two recorders that list an op's outputs in other orders (the
// engine's records, the planner's trace) then keep the same values, whichever the search met first.
BlockPlan without_free_keeps(const BlockGraph& graph, const BlockLink& link, BlockPlan plan) {
  std::vector<int> held;  // kept or offloaded
  for (size_t v = 0; v < plan.keep.size(); ++v)
    if (plan.keep[v] || plan.offload[v]) held.push_back(static_cast<int>(v));
  std::stable_sort(held.begin(), held.end(),
                   [&](int a, int b) { return graph.values[a].bytes > graph.values[b].bytes; });
  for (int v : held) {
    std::vector<bool> keep = plan.keep, offload = plan.offload;
    keep[v] = offload[v] = false;
    BlockPlan fewer = plan_with(graph, std::move(keep), std::move(offload), link);
    if (fewer.rerun == plan.rerun || fewer.cost_ms() <= plan.cost_ms()) {
      fewer.exact = plan.exact;
      plan = std::move(fewer);
    }
  }
  return plan;
}

}  // namespace

BlockPlan solve_block_plan(const BlockGraph& graph, int64_t keep_budget_bytes, const BlockLink& link) {
  return without_free_keeps(graph, link, Search(graph, std::max<int64_t>(0, keep_budget_bytes), link).run());
}

std::vector<BlockPlan> block_plan_frontier(const BlockGraph& graph, int max_points) {
  std::vector<BlockPlan> points;
  int64_t budget = graph.saved_bytes();
  while (static_cast<int>(points.size()) < std::max(1, max_points - 1)) {
    BlockPlan p = solve_block_plan(graph, budget);
    // Two budgets with the same least cost: the one keeping fewer bytes stands for both.
    if (!points.empty() && p.recompute_ms <= points.back().recompute_ms) points.pop_back();
    const int64_t kept = p.kept_bytes;
    points.push_back(std::move(p));
    if (kept == 0) return points;
    budget = kept - 1;
  }
  points.push_back(solve_block_plan(graph, 0));
  return points;
}

std::vector<TensorKindPlan> plan_by_kind(const BlockGraph& graph, const BlockPlan& plan) {
  std::vector<TensorKindPlan> kinds;
  auto of = [&](const std::string& name) -> TensorKindPlan& {
    for (TensorKindPlan& k : kinds)
      if (k.kind == name) return k;
    kinds.push_back({});
    kinds.back().kind = name;
    return kinds.back();
  };
  for (size_t o = 0; o < graph.ops.size(); ++o) {
    TensorKindPlan& k = of(graph.ops[o].name);
    ++k.calls;
    if (o < plan.rerun.size() && plan.rerun[o]) ++k.rerun, k.rerun_ms += graph.ops[o].cost_ms;
  }
  for (size_t v = 0; v < graph.values.size(); ++v) {
    const BlockValue& value = graph.values[v];
    if (!value.saved) continue;
    TensorKindPlan& k = of(graph.ops[value.op].name);
    ++k.saved;
    k.saved_bytes += value.bytes;
    if (v < plan.keep.size() && plan.keep[v]) ++k.kept, k.kept_bytes += value.bytes;
    if (v < plan.offload.size() && plan.offload[v]) ++k.offloaded, k.offload_bytes += value.bytes;
  }
  return kinds;
}

std::vector<bool> selective_op_keep(const BlockGraph& graph) {
  std::vector<bool> keep(graph.values.size(), false);
  std::vector<bool> op_kept(graph.ops.size(), false);
  int products = 0;
  for (size_t o = 0; o < graph.ops.size(); ++o) {
    const std::string_view name = graph.ops[o].name;
    if (name == "linear" || name == "matmul" || name == "bmm") op_kept[o] = products++ % 2 == 0;
    if (name == "attention") op_kept[o] = true;
  }
  for (size_t v = 0; v < graph.values.size(); ++v) keep[v] = graph.values[v].saved && op_kept[graph.values[v].op];
  return keep;
}

}  // namespace ht::schedule

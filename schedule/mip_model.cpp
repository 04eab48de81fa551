#include "schedule/mip_model.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace ht::schedule::detail {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// An op timed at 0 still costs a call: without a floor the solver would recompute it freely.
constexpr double kMinCostMs = 1e-6;
// Share of the budget kept as slack against the solver's feasibility and integrality tolerances.
constexpr double kSlack = 1e-5;

using Row = std::vector<std::pair<int, double>>;

}  // namespace

int LpModel::add_col(double lb, double ub, double cost, bool is_integer) {
  col_lb.push_back(lb);
  col_ub.push_back(ub);
  obj.push_back(cost);
  integer.push_back(is_integer);
  return columns() - 1;
}

void LpModel::add_row(double lb, double ub, const std::vector<std::pair<int, double>>& entries) {
  for (const auto& [col, value] : entries) {
    entry_col.push_back(col);
    entry_val.push_back(value);
  }
  row_start.push_back(static_cast<int>(entry_col.size()));
  row_lb.push_back(lb);
  row_ub.push_back(ub);
}

MipModel::MipModel(const StepGraph& graph, const Needs& needs, int64_t budget_bytes)
    : g_(graph), needs_(needs), budget_(budget_bytes), unit_(std::max(1.0, static_cast<double>(budget_bytes))) {
  keep_col_.assign(graph.values.size(), -1);
  position_.assign(graph.values.size(), -1);
  backward_constant_ = graph.fixed_bytes;
  for (size_t v = 0; v < graph.values.size(); ++v) {
    if (!graph.values[v].droppable) backward_constant_ += graph.values[v].bytes;
    if (graph.values[v].droppable && needs.last_need[v] >= 0) keep_col_[v] = lp_.add_col(0, 1, 0, true);
  }
  add_forward_rows();
  const int count = static_cast<int>(graph.backward.size());
  stages_.resize(count);
  for (int s = count - 1, next = -1; s >= 0; --s) {
    stages_[s].next = next;
    for (int v : graph.backward[s].reads) stages_[s].reads = stages_[s].reads || graph.values[v].droppable;
    if (stages_[s].reads) next = s;
  }
  for (int s = 0, previous = -1; s < count; ++s) {
    if (!stages_[s].reads) continue;
    add_stage(s, previous);
    previous = s;
  }
  for (int s = 0; s < count; ++s) {
    if (!stages_[s].reads) add_idle_stage(s);
  }
}

int64_t mip_budget(int64_t budget_bytes) {
  return std::llround(static_cast<double>(budget_bytes) * (1 - kSlack));
}

double MipModel::room(int64_t constant) {
  if (constant > budget_) infeasible_ = true;
  // Half a byte over the budget less the slack: sums of bytes are integers.
  return (static_cast<double>(mip_budget(budget_)) + 0.5 - static_cast<double>(constant)) / unit_;
}

// One row per forward op whose constant part (values live whatever is kept, working bytes) is
// higher than every later op's: the kept values that weigh on op k weigh on every later op too,
// so a later op with at least as much constant bytes implies k's row.
void MipModel::add_forward_rows() {
  const int ops = static_cast<int>(g_.forward.size());
  std::vector<int64_t> diff(ops + 1, 0);
  for (const Value& v : g_.values) {
    diff[v.producer] += v.bytes;
    diff[v.droppable ? forward_death(v) + 1 : ops] -= v.bytes;
  }
  std::vector<int64_t> constant(ops);
  int64_t live = 0;
  for (int k = 0; k < ops; ++k) {
    live += diff[k];
    constant[k] = g_.fixed_bytes + g_.forward[k].working_bytes + live;
  }
  int64_t later = std::numeric_limits<int64_t>::min();
  for (int k = ops - 1; k >= 0; --k) {
    if (constant[k] <= later) continue;
    later = constant[k];
    Row row;
    for (size_t v = 0; v < g_.values.size(); ++v) {
      if (keep_col_[v] >= 0 && forward_death(g_.values[v]) < k)
        row.push_back({keep_col_[v], scaled(g_.values[v].bytes)});
    }
    const double rhs = room(constant[k]);
    if (!row.empty()) lp_.add_row(-kInf, rhs, row);
  }
}

void MipModel::add_resident(Row& row, const Var& var, double coef) const {
  row.push_back({var.s_col, coef});
  row.push_back({var.r_col, coef});
}

const MipModel::Var* MipModel::find(int s, int value) const {
  const std::vector<Var>& vars = stages_[s].vars;
  auto it = std::lower_bound(vars.begin(), vars.end(), value, [](const Var& v, int x) { return v.value < x; });
  return it != vars.end() && it->value == value ? &*it : nullptr;
}

// `previous`: the last stage before s with variables, -1 when s is the first.
void MipModel::add_stage(int s, int previous) {
  const BackwardStage& bs = g_.backward[s];
  Stage& st = stages_[s];
  std::vector<int> ops;  // those of the values that still matter: s may run them again
  for (size_t v = 0; v < g_.values.size(); ++v) {
    if (!g_.values[v].droppable || needs_.last_need[v] < s) continue;
    const int s_col = previous < 0 ? keep_col_[v] : lp_.add_col(0, 1, 0, true);
    position_[v] = static_cast<int>(st.vars.size());
    st.vars.push_back({static_cast<int>(v), s_col, lp_.add_col(0, 1, 0, true)});
    ops.push_back(g_.values[v].producer);
  }
  std::sort(ops.begin(), ops.end());
  ops.erase(std::unique(ops.begin(), ops.end()), ops.end());
  for (int r : bs.reads) {
    if (!g_.values[r].droppable) continue;
    Row row;
    add_resident(row, st.vars[position_[r]], 1);
    lp_.add_row(1, kInf, row);
  }
  if (previous >= 0) {  // carried in only what was resident during the previous such stage
    for (const Var& var : st.vars) {
      Row row{{var.s_col, 1}};
      add_resident(row, *find(previous, var.value), -1);  // what matters at s mattered then
      lp_.add_row(-kInf, 0, row);
    }
  }
  const int m_col = lp_.add_col(scaled(bs.working_bytes), kInf, 0, false);
  for (int p : ops) add_op_rows(s, p, m_col);
  Row memory{{m_col, 1}};
  for (const Var& var : st.vars) add_resident(memory, var, scaled(g_.values[var.value].bytes));
  lp_.add_row(-kInf, room(backward_constant_), memory);
  if (backward_constant_ + bs.working_bytes > budget_) infeasible_ = true;
  for (const Var& var : st.vars) position_[var.value] = -1;
}

// A stage that reads no droppable value holds what the next one that does carries in (no value
// can matter in between: last_need always lands on a stage that reads).
void MipModel::add_idle_stage(int s) {
  const int64_t constant = backward_constant_ + g_.backward[s].working_bytes;
  const double rhs = room(constant);
  const int next = stages_[s].next;
  if (next < 0 || stages_[next].vars.empty()) return;
  Row memory;
  for (const Var& var : stages_[next].vars) memory.push_back({var.s_col, scaled(g_.values[var.value].bytes)});
  lp_.add_row(-kInf, rhs, memory);
}

void MipModel::add_op_rows(int s, int p, int m_col) {
  const ForwardOp& op = g_.forward[p];
  const std::vector<Var>& vars = stages_[s].vars;
  std::vector<const Var*> kept;  // outputs that may matter at s
  int64_t output_bytes = 0, transient_bytes = 0;
  for (int w : op.outputs) {
    if (!g_.values[w].droppable) continue;
    output_bytes += g_.values[w].bytes;
    if (position_[w] >= 0) {
      kept.push_back(&vars[position_[w]]);
    } else {
      transient_bytes += g_.values[w].bytes;  // exists while p runs, never kept
    }
  }
  const double cost = std::max(op.cost_ms, kMinCostMs);
  int o_col = kept.size() == 1 ? kept[0]->r_col : lp_.add_col(0, 1, cost, false);
  if (kept.size() == 1) {
    lp_.obj[o_col] = cost;
  } else {
    for (const Var* w : kept) lp_.add_row(-kInf, 0, {{w->r_col, 1}, {o_col, -1}});
  }
  std::vector<int> inputs = op.inputs;
  std::sort(inputs.begin(), inputs.end());
  inputs.erase(std::unique(inputs.begin(), inputs.end()), inputs.end());
  for (int u : inputs) {
    if (!g_.values[u].droppable) continue;
    Row row{{o_col, 1}};
    if (position_[u] >= 0) add_resident(row, vars[position_[u]], -1);  // else p can never run here
    lp_.add_row(-kInf, 0, row);
  }
  // While p runs: its working bytes and its outputs that are neither resident nor listed. With
  // one output that matters, it is resident whenever p runs.
  if (kept.size() == 1) {
    if (op.working_bytes + transient_bytes > 0)
      lp_.add_row(0, kInf, {{m_col, 1}, {o_col, -scaled(op.working_bytes + transient_bytes)}});
    return;
  }
  Row row{{m_col, 1}, {o_col, -scaled(op.working_bytes + output_bytes)}};
  for (const Var* w : kept) add_resident(row, *w, scaled(g_.values[w->value].bytes));
  lp_.add_row(0, kInf, row);
}

int MipModel::integer_columns() const {
  return static_cast<int>(std::count(lp_.integer.begin(), lp_.integer.end(), 1));
}

std::vector<double> MipModel::start_from(const Schedule& schedule) const {
  const size_t n = g_.values.size();
  std::vector<char> resident(n, 0);
  for (size_t v = 0; v < n; ++v) resident[v] = !g_.values[v].droppable || schedule.keep[v];
  std::vector<double> x(lp_.columns(), 0.0);
  for (size_t s = 0; s < stages_.size(); ++s) {
    for (const Var& var : stages_[s].vars) x[var.s_col] = resident[var.value];
    for (int v : schedule.recompute[s]) {
      const Var* var = find(static_cast<int>(s), v);
      if (var == nullptr) return {};  // recomputes where the model never does
      x[var->r_col] = 1;
      resident[v] = 1;
    }
    for (int v : schedule.free_after[s]) resident[v] = 0;
  }
  return x;
}

Schedule MipModel::decode(const std::vector<double>& x) const {
  const size_t n = g_.values.size(), stages = stages_.size();
  Schedule out;
  out.keep.assign(n, 0);
  out.recompute.assign(stages, {});
  out.free_after.assign(stages, {});
  for (size_t v = 0; v < n; ++v) out.keep[v] = !g_.values[v].droppable || (keep_col_[v] >= 0 && x[keep_col_[v]] > 0.5);
  for (size_t s = 0; s < stages; ++s) {
    const int next = stages_[s].next;
    for (const Var& var : stages_[s].vars) {
      const bool carried_in = x[var.s_col] > 0.5;
      const bool recomputed = !carried_in && x[var.r_col] > 0.5;
      if (recomputed) out.recompute[s].push_back(var.value);
      if (!carried_in && !recomputed) continue;
      const Var* later = next >= 0 ? find(next, var.value) : nullptr;
      if (later == nullptr || x[later->s_col] <= 0.5) out.free_after[s].push_back(var.value);
    }
    std::sort(out.recompute[s].begin(), out.recompute[s].end(), [&](int a, int b) {
      const int pa = g_.values[a].producer, pb = g_.values[b].producer;
      return pa != pb ? pa < pb : a < b;
    });
  }
  return out;
}

}  // namespace ht::schedule::detail

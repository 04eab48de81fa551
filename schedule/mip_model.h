#pragma once
// The MIP of Checkmate (Jain et al. 2020, "Checkmate: breaking the memory wall with optimal
// tensor rematerialization") restricted to our engine: forward runs once and keeps or drops each
// value; recomputation happens only just before a backward stage. Written as a solver-neutral
// linear program, with the maps between its columns and a Schedule. Private to schedule/.
//
// Per value v backward needs (needs.h): K[v], kept through forward. Per stage s that reads a
// droppable value and each value v that may still matter at s (last_need[v] >= s): S[s][v],
// resident entering s (K at the first such stage), and R[s][v], recomputed before s (also when
// only a later stage reads it: recomputing early can spare keeping its inputs). Per op p with
// several such outputs: O[s][p] in [0, 1], it runs; an op with one is charged on that R. Per
// stage: M[s], the bytes beyond resident values while it or one of its recomputations runs.
//   reads: S + R >= 1;  R[s][w] <= O[s][p];  O[s][p] <= S[s][u] + R[s][u] for each input u of p
//   (recomputations run in forward order, so an input recomputed in the same stage is there in
//   time);  S[s'][v] <= S[s][v] + R[s][v] for consecutive such stages s < s';
//   forward op k: fixed + working + live values + kept values' bytes <= budget;
//   stage s: fixed + non-droppable + sum bytes * (S + R) + M[s] <= budget, with M[s] >= the
//   stage's working bytes and M[s] >= working + outputs discarded after it, of each op run.
//   The objective: sum of cost * O (or R).
// Stages that read no droppable value hold what the next stage that does carries in, and run
// nothing again (freeing later or recomputing earlier than needed only costs memory there), so
// they add one memory row and no column. S + R <= 1 is left out: a value both carried and
// recomputed only counts twice against the budget, and decode() takes it as carried.
// The recomputation rows count every value resident during the stage, including those
// recomputed after the op in the list, and the stage rows ignore that simulate() frees what a
// stage frees and does not read as soon as its recompute list is done with it
// (early_free_points): conservative, so every solution simulates within budget up to the
// solver's tolerances (1e-5 of the budget is kept as slack against those), and schedules that
// fit only thanks to early frees are the heuristic's to find.

#include "schedule/needs.h"
#include "schedule/schedule.h"

#include <cstdint>
#include <utility>
#include <vector>

namespace ht::schedule::detail {

// min obj * x subject to row_lb <= A x <= row_ub, col_lb <= x <= col_ub, some x integer.
struct LpModel {
  std::vector<double> col_lb, col_ub, obj;
  std::vector<char> integer;
  std::vector<double> row_lb, row_ub;
  std::vector<int> row_start{0};  // row r's entries: [row_start[r], row_start[r + 1])
  std::vector<int> entry_col;
  std::vector<double> entry_val;

  int add_col(double lb, double ub, double cost, bool is_integer);
  void add_row(double lb, double ub, const std::vector<std::pair<int, double>>& entries);
  int columns() const { return static_cast<int>(obj.size()); }
  int rows() const { return static_cast<int>(row_lb.size()); }
};

// The budget the model's rows enforce: `budget_bytes` less the slack above.
int64_t mip_budget(int64_t budget_bytes);

class MipModel {
 public:
  MipModel(const StepGraph& graph, const Needs& needs, int64_t budget_bytes);

  // Bytes no schedule moves exceed the budget at some op or stage: no need to solve.
  bool infeasible() const { return infeasible_; }
  const LpModel& lp() const { return lp_; }
  int integer_columns() const;
  // A schedule as a point of the model (a warm start; only the integer columns are set), or
  // empty when the schedule lies outside the model.
  std::vector<double> start_from(const Schedule& schedule) const;
  Schedule decode(const std::vector<double>& x) const;

 private:
  struct Var {
    int value;
    int s_col;  // S[s][value] (K at the first stage with variables)
    int r_col;  // R[s][value]
  };
  struct Stage {
    bool reads = false;     // reads a droppable value: has variables
    int next = -1;          // the next stage after it that reads one, -1: none
    std::vector<Var> vars;  // by value
  };

  void add_forward_rows();
  void add_stage(int s, int previous);
  void add_idle_stage(int s);
  void add_op_rows(int s, int p, int m_col);
  double scaled(int64_t bytes) const { return static_cast<double>(bytes) / unit_; }
  // Right-hand side for rows whose constant part is `constant` bytes.
  double room(int64_t constant);
  void add_resident(std::vector<std::pair<int, double>>& row, const Var& var, double coef) const;
  const Var* find(int s, int value) const;

  const StepGraph& g_;
  const Needs& needs_;
  const int64_t budget_;
  const double unit_;
  LpModel lp_;
  bool infeasible_ = false;
  int64_t backward_constant_ = 0;  // fixed and non-droppable bytes, live through backward
  std::vector<int> keep_col_;      // per value, -1 when not a variable
  std::vector<Stage> stages_;
  std::vector<int> position_;  // scratch: value -> index in the current stage's vars, or -1
};

}  // namespace ht::schedule::detail

#include "schedule/cbc_backend.h"

#include <coin/Cbc_C_Interface.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

namespace ht::schedule::detail {
namespace {

struct CbcDeleter {
  void operator()(Cbc_Model* m) const { Cbc_deleteModel(m); }
};
using CbcPtr = std::unique_ptr<Cbc_Model, CbcDeleter>;

// CBC loads columns (compressed sparse columns); the model is built by rows.
CbcPtr load(const LpModel& lp) {
  const int cols = lp.columns(), rows = lp.rows();
  std::vector<CoinBigIndex> start(cols + 1, 0);
  for (int c : lp.entry_col) ++start[c + 1];
  for (int c = 0; c < cols; ++c) start[c + 1] += start[c];
  std::vector<CoinBigIndex> fill(start.begin(), start.end() - 1);
  std::vector<int> index(lp.entry_col.size());
  std::vector<double> value(lp.entry_col.size());
  for (int r = 0; r < rows; ++r) {
    for (int e = lp.row_start[r]; e < lp.row_start[r + 1]; ++e) {
      const CoinBigIndex at = fill[lp.entry_col[e]]++;
      index[at] = r;
      value[at] = lp.entry_val[e];
    }
  }
  CbcPtr model(Cbc_newModel());
  // CBC takes infinite bounds as +-COIN_DBL_MAX, which std::numeric_limits' infinity is not.
  auto finite = [](std::vector<double> v) {
    for (double& x : v) x = std::isinf(x) ? std::copysign(1e300, x) : x;
    return v;
  };
  Cbc_loadProblem(model.get(), cols, rows, start.data(), index.data(), value.data(), lp.col_lb.data(),
                  finite(lp.col_ub).data(), lp.obj.data(), finite(lp.row_lb).data(), finite(lp.row_ub).data());
  for (int c = 0; c < cols; ++c) {
    if (lp.integer[c]) Cbc_setInteger(model.get(), c);
  }
  Cbc_setObjSense(model.get(), 1);  // minimize
  return model;
}

}  // namespace

bool mip_solver_built() { return true; }

MipOutcome solve_with_cbc(const LpModel& lp, const std::vector<double>& start, double time_limit_s) {
  CbcPtr model = load(lp);
  Cbc_setLogLevel(model.get(), 0);
  Cbc_setParameter(model.get(), "log", "0");
  Cbc_setParameter(model.get(), "slog", "0");
  Cbc_setParameter(model.get(), "timeMode", "elapsed");  // CBC counts CPU seconds by default
  // CBC 2.10's preprocessing crashes in CglPreProcess::postProcess when the time limit ends the
  // search at an unlucky moment (seen under load with a 1 s limit: a segfault one run in six);
  // its postprocessing after a time-out is a known weak spot upstream. Our rows are small and
  // already tight, so the search loses little without it.
  Cbc_setParameter(model.get(), "preprocess", "off");
  Cbc_setMaximumSeconds(model.get(), std::max(time_limit_s, 1e-3));
  if (!start.empty()) {
    // Every integer column, zeros included: CBC leaves the columns a start does not name free.
    std::vector<int> columns;
    std::vector<double> values;
    for (int c = 0; c < lp.columns(); ++c) {
      if (!lp.integer[c]) continue;
      columns.push_back(c);
      values.push_back(start[c]);
    }
    Cbc_setMIPStartI(model.get(), static_cast<int>(columns.size()), columns.data(), values.data());
  }
  Cbc_solve(model.get());

  MipOutcome out;
  out.optimal = Cbc_isProvenOptimal(model.get()) != 0;
  out.infeasible = Cbc_isProvenInfeasible(model.get()) != 0;
  const double* best = Cbc_bestSolution(model.get());
  if (best != nullptr && !out.infeasible) {
    out.has_solution = true;
    out.x.assign(best, best + lp.columns());
    out.objective = Cbc_getObjValue(model.get());
  }
  const double bound = Cbc_getBestPossibleObjValue(model.get());
  out.bound = std::isfinite(bound) && std::fabs(bound) < 1e299 ? std::max(0.0, bound) : 0.0;
  if (out.optimal) out.bound = out.objective;
  return out;
}

}  // namespace ht::schedule::detail

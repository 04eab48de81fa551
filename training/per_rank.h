#pragma once
// Statistics every rank of a group has for itself (a step's times, its memory peak), made known to
// all of them: one all-reduce of a table with a column per rank, each rank filling its own.

#include "parallel/communicator.h"

#include <ATen/ATen.h>

#include <vector>

namespace ht {

// mine[i] is this rank's i-th value; the result's [i][r] is rank r's. A collective of `group`:
// every rank calls it with as many values.
inline std::vector<std::vector<double>> gather_per_rank(Communicator& group, const std::vector<double>& mine,
                                                        const char* what) {
  const int ranks = group.size(), me = group.rank();
  const int64_t values = static_cast<int64_t>(mine.size());
  at::Tensor table = at::zeros({values, ranks}, at::kDouble);
  for (int64_t i = 0; i < values; ++i) table[i][me] = mine[static_cast<size_t>(i)];
  group.allreduce_sum(table, what);
  std::vector<std::vector<double>> rows(mine.size(), std::vector<double>(static_cast<size_t>(ranks)));
  const auto t = table.accessor<double, 2>();
  for (int64_t i = 0; i < values; ++i)
    for (int r = 0; r < ranks; ++r) rows[static_cast<size_t>(i)][static_cast<size_t>(r)] = t[i][r];
  return rows;
}

}  // namespace ht

#pragma once
// What every benchmark program summarizes its samples with.

#include <algorithm>
#include <vector>

namespace ht::bench {

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

}  // namespace ht::bench

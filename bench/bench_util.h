#pragma once
// What every benchmark program summarizes its samples with.

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace ht::bench {

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// The number after "key": in a metrics.jsonl line; nothing when absent or null.
inline std::optional<double> json_number(const std::string& line, const std::string& key) {
  const std::string k = "\"" + key + "\":";
  const size_t at = line.find(k);
  if (at == std::string::npos) return std::nullopt;
  const char* s = line.c_str() + at + k.size();
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  if (end == s) return std::nullopt;
  return v;
}

}  // namespace ht::bench

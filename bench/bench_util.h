#pragma once
// What every benchmark program summarizes its samples with.

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace ht::bench {

inline double median(std::vector<double> v) {
  if (v.empty()) return NAN;
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

// The numbers of a flat JSON array under `key` in one JSON line ("key": [1, 2.5]); empty when
// the key is absent.
inline std::vector<double> json_numbers(const std::string& line, const std::string& key) {
  std::vector<double> out;
  const std::string k = "\"" + key + "\":";
  const size_t at = line.find(k);
  if (at == std::string::npos) return out;
  const char* s = line.c_str() + at + k.size();
  while (*s == ' ') ++s;
  if (*s++ != '[') return out;
  while (true) {
    char* end = nullptr;
    const double v = std::strtod(s, &end);
    if (end == s) break;
    out.push_back(v);
    s = end;
    while (*s == ' ') ++s;
    if (*s++ != ',') break;
  }
  return out;
}

}  // namespace ht::bench

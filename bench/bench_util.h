#pragma once
// What every benchmark program summarizes its samples with.

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
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

// A file's whole text ("" when it cannot be read): a child run's log or output.
inline std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The hybrid_train next to this program's build folder (build/bench/x -> build/launcher/hybrid_train).
inline std::string hybrid_train_beside_this_program() {
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe");
  return (self.parent_path().parent_path() / "launcher" / "hybrid_train").string();
}

}  // namespace ht::bench

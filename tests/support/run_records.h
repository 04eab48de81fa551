#pragma once
// Test support: numbers from what a run wrote (metrics.jsonl).

#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <string>
#include <vector>

namespace ht::test {

// The last train record's number for `key` in a run's metrics.jsonl (a failure, and -1, if none).
inline double last_train_number(const std::string& metrics, const std::string& key) {
  std::ifstream in(metrics);
  std::string line, last;
  while (std::getline(in, line))
    if (line.find("\"train\"") != std::string::npos) last = line;
  std::smatch m;
  if (!std::regex_search(last, m, std::regex("\"" + key + "\": ([-0-9.e+]+)"))) {
    ADD_FAILURE() << key << " not in the last train record of " << metrics;
    return -1;
  }
  return std::stod(m[1]);
}

// Every train record's number for `key` in a run's metrics.jsonl, in order.
inline std::vector<double> train_numbers(const std::string& metrics, const std::string& key) {
  std::ifstream in(metrics);
  std::string line;
  std::vector<double> out;
  const std::regex number("\"" + key + "\": ([-0-9.e+]+)");
  std::smatch m;
  while (std::getline(in, line))
    if (line.find("\"train\"") != std::string::npos && std::regex_search(line, m, number)) out.push_back(std::stod(m[1]));
  return out;
}

}  // namespace ht::test

#pragma once
// Reads a config file and command-line overrides into a validated Config: the one place where
// config is parsed and checked. Every error is a UserError naming file:line:column (or the
// argument), the key, the bad value and what would work.

#include "launcher/config/config.h"

#include <string>
#include <vector>

namespace ht {

// --section.key=value from the command line.
struct ConfigOverride {
  std::string path;      // "section.key"
  std::string value;     // the text after '='
  std::string argument;  // as typed, for messages
};

// `--section.key=value` as typed (benchmarks and tests build their overrides so).
inline ConfigOverride override_of(const std::string& argument) {
  const size_t eq = argument.find('=');
  return {argument.substr(2, eq - 2), argument.substr(eq + 1), argument};
}

struct LoadedConfig {
  Config config;
  std::vector<std::string> warnings;  // options that have no effect in the chosen setup
};

LoadedConfig load_config(const std::string& path, const std::vector<ConfigOverride>& overrides);

// The name among `candidates` nearest to `name` (edit distance), or "" if none is close.
std::string nearest_name(const std::string& name, const std::vector<std::string>& candidates);

}  // namespace ht

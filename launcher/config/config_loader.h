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

struct LoadedConfig {
  Config config;
  std::vector<std::string> warnings;  // options that have no effect in the chosen setup
};

LoadedConfig load_config(const std::string& path, const std::vector<ConfigOverride>& overrides);

// The name among `candidates` nearest to `name` (edit distance), or "" if none is close.
std::string nearest_name(const std::string& name, const std::vector<std::string>& candidates);

}  // namespace ht

#pragma once
// The command line: hybrid_train CONFIG.toml [--section.key=value ...] | --help | --version, or
// hybrid_train plan CONFIG.toml [--ranks ...] [--device-memory ...] [--objective ...] [overrides]

#include "launcher/config/config_loader.h"
#include "launcher/planning/plan_command.h"

#include <string>
#include <vector>

namespace ht {

struct CommandLine {
  std::string config_path;
  std::vector<ConfigOverride> overrides;
  int exit_code = -1;  // >= 0: the command line was fully handled (help, version, error)
  bool plan = false;   // `hybrid_train plan`: plan, do not train
  std::string report_dir;  // `hybrid_train report RUN_DIR`: write its report.html, do not train
  PlanCommand plan_command;
};

CommandLine parse_command_line(int argc, const char* const* argv);

}  // namespace ht

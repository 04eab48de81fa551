#pragma once
// The command line: hybrid_train CONFIG.toml [--section.key=value ...] | --help | --version, or
// hybrid_train plan CONFIG.toml [--ranks ...] [--device-memory ...] [--objective ...] [overrides], or
// hybrid_train report RUN_DIR, or hybrid_train tokenize --input FILE... [--model-prefix P | --model M] [--output T.bin]
// hybrid_train export RUN_DIR [--output DIR] [--dtype ...], or hybrid_train sample RUN_DIR --prompt TEXT [...]

#include "launcher/config/config_loader.h"
#include "launcher/export/commands.h"
#include "launcher/planning/plan_command.h"
#include "launcher/tokenize/tokenize_command.h"

#include <optional>
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
  std::optional<ExportArgs> export_args;  // `hybrid_train export RUN_DIR`: a Hugging Face checkpoint
  std::optional<SampleArgs> sample_args;  // `hybrid_train sample RUN_DIR --prompt ...`: generate text
  bool tokenize = false;  // `hybrid_train tokenize`: text files to a tokenizer and token files
  TokenizeArgs tokenize_args;
  std::vector<std::string> warnings;  // what the command line itself is read as, said once
};

CommandLine parse_command_line(int argc, const char* const* argv);

}  // namespace ht

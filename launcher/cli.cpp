#include "launcher/cli.h"

#include "launcher/config/config_text.h"
#include "launcher/user_error.h"

#include <CLI/CLI.hpp>

#include <iostream>

#ifndef HT_VERSION
#define HT_VERSION "unknown"
#endif

namespace ht {
namespace {

// CLI11 hands over what it does not know; those are the --section.key=value overrides.
std::vector<ConfigOverride> overrides_from(const std::vector<std::string>& extras) {
  std::vector<ConfigOverride> out;
  for (size_t i = 0; i < extras.size(); ++i) {
    const std::string& arg = extras[i];
    if (arg.rfind("--", 0) != 0 || arg.size() <= 2) {
      throw UserError("argument '" + arg + "': unexpected; usage: hybrid_train CONFIG.toml [--section.key=value ...]");
    }
    const size_t eq = arg.find('=');
    if (eq != std::string::npos) {
      out.push_back({arg.substr(2, eq - 2), arg.substr(eq + 1), arg});
    } else if (i + 1 < extras.size() && extras[i + 1].rfind("--", 0) != 0) {
      out.push_back({arg.substr(2), extras[i + 1], arg + " " + extras[i + 1]});
      ++i;
    } else {
      throw UserError("argument " + arg + ": missing value; write " + arg + "=VALUE");
    }
  }
  return out;
}

}  // namespace

CommandLine parse_command_line(int argc, const char* const* argv) {
  CommandLine cl;
  CLI::App app{"hybrid_train: trains the model a config file describes, through an interpreter that can "
               "trade compute for memory."};
  app.name("hybrid_train");
  app.allow_extras();
  app.set_version_flag("--version", std::string("hybrid_train ") + HT_VERSION);
  app.add_option("config", cl.config_path, "the job's TOML file, e.g. configs/quickstart.toml");
  bool markdown = false;
  app.add_flag("--config-reference-markdown", markdown, "print the config reference as Markdown and exit")
      ->group("");  // hidden: the README's reference is generated with it
  app.footer("\n" + config_reference_text() +
             "\nOverrides win over the file and are type-checked like it, e.g. --training.steps=20.");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    cl.exit_code = app.exit(e) == 0 ? 0 : kUserErrorExitCode;
    return cl;
  }
  if (markdown) {
    std::cout << config_reference_markdown();
    cl.exit_code = 0;
    return cl;
  }
  cl.overrides = overrides_from(app.remaining());
  if (cl.config_path.empty()) {
    throw UserError("no config file given; usage: hybrid_train CONFIG.toml [--section.key=value ...], "
                    "e.g. hybrid_train configs/quickstart.toml");
  }
  return cl;
}

}  // namespace ht

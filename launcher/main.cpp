// hybrid_train CONFIG.toml [--section.key=value ...]: parse, build, train, report.
#include "launcher/cli.h"
#include "launcher/config/config_loader.h"
#include "launcher/job.h"
#include "launcher/user_error.h"

#include <cstdio>

int main(int argc, char** argv) {
  try {
    const ht::CommandLine cl = ht::parse_command_line(argc, argv);
    if (cl.exit_code >= 0) return cl.exit_code;
    const ht::LoadedConfig loaded = ht::load_config(cl.config_path, cl.overrides);
    for (const std::string& w : loaded.warnings) std::fprintf(stderr, "hybrid_train: warning: %s\n", w.c_str());
    ht::run_job(loaded.config);
    return 0;
  } catch (const ht::UserError& e) {
    std::fprintf(stderr, "hybrid_train: error: %s\n", e.what());
    return ht::kUserErrorExitCode;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "hybrid_train: internal error: %s\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hybrid_train: internal error: %s\n", e.what());
    return 1;
  }
}

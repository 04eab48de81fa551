#pragma once
// The ranks of a running mpirun job, found by a marker on their command line (its output folder):
// what the tests that stop one rank (a hang) need.

#include "tests/support/temp_dir.h"

#include <sys/types.h>

#include <filesystem>
#include <string>
#include <vector>

namespace ht::test {

// The pids of the ranks (not mpirun) whose command line holds `marker`.
inline std::vector<pid_t> ranks_running(const std::string& marker) {
  std::vector<pid_t> pids;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string comm = read_file(entry.path().string() + "/comm");
    std::string cmdline = read_file(entry.path().string() + "/cmdline");
    if (comm.rfind("hybrid_train", 0) == 0 && cmdline.find(marker) != std::string::npos) {
      pids.push_back(static_cast<pid_t>(std::stol(name)));
    }
  }
  return pids;
}

}  // namespace ht::test

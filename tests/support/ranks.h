#pragma once
// The ranks of a running mpirun job, found by a marker on their command line (its output folder):
// what the tests that stop one rank (a hang) need.

#include "tests/support/temp_dir.h"

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>
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

// What became of a job one of whose ranks stopped answering (run_with_a_stopped_rank).
struct StoppedRankJob {
  size_t ranks_seen = 0;  // ranks found training before the stop: 2 where the job started well
  std::string status;     // the job's exit status as the shell printed it; empty: it still ran 200 s after
  std::string log;        // its output
};

// Starts `job` (a command line of mpirun and 2 ranks writing to `out`) in the background; once both
// ranks train (a metrics line written), stops rank 1 with SIGSTOP (neither dead nor progressing,
// which mpirun cannot see) and waits up to 200 s for the job to end, then kills what is left. No
// bound on how soon it ends: a loaded machine starts mpirun slowly; the tests read the configured
// timeout in the log instead.
inline StoppedRankJob run_with_a_stopped_rank(const std::string& job, const std::string& out, const TempDir& dir) {
  const std::string log = dir.path("log.txt"), status = dir.path("rc.txt");
  std::system(("(" + job + " > " + log + " 2>&1; echo $? > " + status + ") &").c_str());
  StoppedRankJob r;
  std::vector<pid_t> pids;
  for (int i = 0; i < 1800 && (pids.size() < 2 || read_file(out + "/metrics.jsonl").empty()); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    pids = ranks_running(out);
  }
  r.ranks_seen = pids.size();
  if (pids.size() == 2) {
    ::kill(pids[1], SIGSTOP);
    const auto stopped = std::chrono::steady_clock::now();
    while (read_file(status).empty() && std::chrono::steady_clock::now() - stopped < std::chrono::seconds(200))
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  for (pid_t pid : ranks_running(out)) ::kill(pid, SIGKILL);  // if the job did not end, do not leave it
  r.status = read_file(status);
  r.log = read_file(log);
  return r;
}

}  // namespace ht::test

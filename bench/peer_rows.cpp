#include "bench/peer_rows.h"

#include <cstdio>
#include <deque>

namespace ht::bench {

std::vector<PeerRow> run_peer(const std::string& python, const std::string& script, const std::string& args,
                              std::string& failure) {
  const std::string command = python + " " + script + " " + args + " 2>&1";
  std::vector<PeerRow> rows;
  std::deque<std::string> tail;  // the last lines, for the failure
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    failure = "cannot start: " + command;
    return rows;
  }
  char line[4096];
  while (std::fgets(line, sizeof line, pipe) != nullptr) {
    char mode[64];
    double ms = 0;
    long long peak = -1;
    if (std::sscanf(line, "peer-row %63s %lf %lld", mode, &ms, &peak) == 3) {
      rows.push_back({mode, ms, static_cast<int64_t>(peak)});
    } else {
      tail.emplace_back(line);
      if (tail.size() > 8) tail.pop_front();
    }
  }
  const int status = pclose(pipe);
  if (rows.empty()) {
    failure = command + " exited with status " + std::to_string(status) + ":\n";
    for (const std::string& l : tail) failure += "  " + l;
  }
  return rows;
}

void print_peer_rows(const std::string& workload, double ours_ms, int64_t ours_peak, const std::vector<PeerRow>& rows) {
  auto mib = [](int64_t bytes) { return bytes < 0 ? std::string("-") : std::to_string(bytes >> 20); };
  std::printf("\n%s against the peer (bench/peer/gpu_peer.py, its own process; medians):\n\n", workload.c_str());
  std::printf("| %-36s | %10s | %8s | %9s | %7s |\n", "run", "step ms", "vs ours", "peak MiB", "vs ours");
  std::printf("|%s|\n", std::string(86, '-').c_str());
  std::printf("| %-36s | %10.2f | %7.2fx | %9s | %6.2fx |\n", "hybrid_train, no budget", ours_ms, 1.0,
              mib(ours_peak).c_str(), 1.0);
  for (const PeerRow& r : rows) {
    const std::string name = r.mode == "eager" ? "PyTorch eager" : r.mode == "checkpoint" ? "torch.utils.checkpoint, every block" : r.mode;
    char peak_ratio[32] = "-";
    if (r.peak_bytes >= 0 && ours_peak > 0) {
      std::snprintf(peak_ratio, sizeof peak_ratio, "%.2fx", static_cast<double>(r.peak_bytes) / static_cast<double>(ours_peak));
    }
    std::printf("| %-36s | %10.2f | %7.2fx | %9s | %7s |\n", name.c_str(), r.step_ms, r.step_ms / ours_ms,
                mib(r.peak_bytes).c_str(), peak_ratio);
  }
  std::fflush(stdout);
}

}  // namespace ht::bench

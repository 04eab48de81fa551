#include "bench/peer_rows.h"

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
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

PeerSession::PeerSession(const std::string& python, const std::string& script, const std::string& args) {
  const std::string command = python + " " + script + " " + args + " --serve 2>&1";
  std::signal(SIGPIPE, SIG_IGN);  // a peer that died fails its step, not this process
  int in[2], out[2];
  if (pipe(in) != 0 || pipe(out) != 0) {
    failure_ = "cannot make pipes for: " + command;
    return;
  }
  pid_ = fork();
  if (pid_ == 0) {
    dup2(in[0], STDIN_FILENO);
    dup2(out[1], STDOUT_FILENO);
    close(in[0]), close(in[1]), close(out[0]), close(out[1]);
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    std::_Exit(127);
  }
  close(in[0]), close(out[1]);
  if (pid_ < 0) {
    close(in[1]), close(out[0]);
    failure_ = "cannot start: " + command;
    return;
  }
  to_ = fdopen(in[1], "w");
  from_ = fdopen(out[0], "r");
  ok_ = !read_until("peer-ready").empty();
  if (!ok_) failure_ = command + " did not become ready:\n" + tail_;
}

PeerSession::~PeerSession() {
  if (to_ != nullptr) std::fclose(to_);  // the end of its stdin: it returns
  if (from_ != nullptr) {  // what it prints until it exits, read so that it never blocks writing
    char line[4096];
    while (std::fgets(line, sizeof line, from_) != nullptr) {
    }
    std::fclose(from_);
  }
  if (pid_ > 0) waitpid(pid_, nullptr, 0);
}

double PeerSession::step() {
  if (!ok_) return -1;
  std::fputs("step\n", to_);
  std::fflush(to_);
  const std::string line = read_until("peer-step ");
  double ms = -1;
  if (line.empty() || std::sscanf(line.c_str(), "peer-step %lf", &ms) != 1) {
    ok_ = false;
    failure_ = "the peer stopped in a step:\n" + tail_;
    return -1;
  }
  return ms;
}

std::string PeerSession::read_until(const std::string& prefix) {
  char line[4096];
  std::deque<std::string> tail;
  while (from_ != nullptr && std::fgets(line, sizeof line, from_) != nullptr) {
    if (std::string(line).rfind(prefix, 0) == 0) return line;
    tail.emplace_back(line);
    if (tail.size() > 8) tail.pop_front();
  }
  tail_.clear();
  for (const std::string& l : tail) tail_ += "  " + l;
  return {};
}

}  // namespace ht::bench

#pragma once
// The peer a user would pick, beside a benchmark's own rows: bench/peer/gpu_peer.py (PyTorch
// eager, and torch.utils.checkpoint around every block) on the same model and batch, run as a
// child process by the Python the caller names. Its rows run after this process's own runs, in
// its own process, compared as medians; a PeerSession takes its steps one at a time, to
// interleave them with ours.

#include <sys/types.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace ht::bench {

struct PeerRow {
  std::string mode;         // "eager", "checkpoint"
  double step_ms = 0;       // median of the measured steps
  int64_t peak_bytes = -1;  // torch.cuda.max_memory_allocated(); -1 on the CPU
};

// Runs `python script args`, returns its rows; empty, with `failure` set (its last lines), when
// it printed none.
std::vector<PeerRow> run_peer(const std::string& python, const std::string& script, const std::string& args,
                              std::string& failure);

// The table: hybrid_train's step without a budget (`ours_ms`, `ours_peak`), then each peer row
// with its time and peak as ratios of ours.
void print_peer_rows(const std::string& workload, double ours_ms, int64_t ours_peak, const std::vector<PeerRow>& rows);

// gpu_peer.py --serve: the peer's training step, one per step() call, in a child process that
// lives as long as this object.
class PeerSession {
 public:
  // Starts `python script args --serve` and waits for its warm-up; ok() is false (failure() says
  // why, with its last lines) when it did not become ready.
  PeerSession(const std::string& python, const std::string& script, const std::string& args);
  ~PeerSession();
  PeerSession(const PeerSession&) = delete;
  PeerSession& operator=(const PeerSession&) = delete;
  bool ok() const { return ok_; }
  const std::string& failure() const { return failure_; }
  // One step; its milliseconds as the peer timed it; a negative value (and ok() false) when it failed.
  double step();

 private:
  // Reads lines until one starts with `prefix`; returns it (empty at the end of the output).
  std::string read_until(const std::string& prefix);
  pid_t pid_ = -1;
  FILE* to_ = nullptr;
  FILE* from_ = nullptr;
  bool ok_ = false;
  std::string failure_, tail_;
};

}  // namespace ht::bench

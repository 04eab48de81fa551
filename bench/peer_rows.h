#pragma once
// The peer a user would pick, beside a benchmark's own rows: bench/peer/gpu_peer.py (PyTorch
// eager, and torch.utils.checkpoint around every block) on the same model and batch, run as a
// child process by the Python the caller names. It runs after this process's own runs, in its
// own process: step times are compared as medians, not interleaved.

#include <cstdint>
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

}  // namespace ht::bench

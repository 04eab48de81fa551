#pragma once
// SIGTERM and SIGINT as a request to stop, not an end: Slurm's preemption before the time limit,
// Kubernetes evicting a pod, a user's Ctrl-C. The first signal sets a flag that the training loop
// reads after each step: it finishes that step, writes a checkpoint and ends with a line saying
// where and how to resume (exit code 128 + the signal, as a shell reports a signal's end). A
// second signal ends the process at once, without a checkpoint; checkpoints are written beside
// their folder and renamed into place (checkpoint.h), so none is left half written.
//
// Under mpirun one rank may get the signal and another not (or later): the ranks agree after
// each step, by an all-reduce, so that all stop after the same step.

namespace ht {

class StopSignals {
 public:
  StopSignals();   // installs the handlers (SIGTERM, SIGINT)
  ~StopSignals();  // restores the ones before
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first signal received while installed (SIGTERM or SIGINT), 0 if none.
  static int received();
  // Forgets a received signal (tests, and a job started after another in one process).
  static void clear();
};

// "SIGTERM", "SIGINT", or "signal N".
const char* signal_name(int signal);

}  // namespace ht

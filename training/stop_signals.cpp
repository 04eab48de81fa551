#include "training/stop_signals.h"

#include <csignal>
#include <unistd.h>

namespace ht {
namespace {

volatile std::sig_atomic_t g_received = 0;
struct sigaction g_previous_term, g_previous_int;

void write_stderr(const char* text, size_t n) {
  const ssize_t ignored = ::write(STDERR_FILENO, text, n);  // async-signal-safe; nothing to do if it fails
  (void)ignored;
}

void on_signal(int signal) {
  if (g_received != 0) {
    static const char kNow[] = "\nhybrid_train: a second signal: ending now, without a checkpoint\n";
    write_stderr(kNow, sizeof kNow - 1);
    ::_exit(128 + signal);
  }
  g_received = signal;
  static const char kAfter[] =
      "\nhybrid_train: signal received: stopping after this step, with a checkpoint (a second signal ends at once; "
      "when mpirun sent it because a rank died, it ends this rank before that checkpoint: the last complete one is "
      "the one to resume)\n";
  write_stderr(kAfter, sizeof kAfter - 1);
}

}  // namespace

StopSignals::StopSignals() {
  g_received = 0;
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // system calls a signal interrupts go on (file writes, MPI's waits)
  sigaction(SIGTERM, &action, &g_previous_term);
  sigaction(SIGINT, &action, &g_previous_int);
}

StopSignals::~StopSignals() {
  sigaction(SIGTERM, &g_previous_term, nullptr);
  sigaction(SIGINT, &g_previous_int, nullptr);
}

int StopSignals::received() { return g_received; }
void StopSignals::clear() { g_received = 0; }

const char* signal_name(int signal) {
  switch (signal) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    default: return "a signal";
  }
}

}  // namespace ht

#pragma once
// The timeout of collectives the host does not wait for (issue 67). On a GPU, NCCL's calls are
// queued on a stream and return; the compute stream waits for them on an event, the host goes on.
// A rank that died or hangs then shows nowhere on the host until something reads a result, and
// there it would hang for good. So a thread of the communicator's watches what is under way: each
// call's completion (an event), and the backend's asynchronous error (ncclCommGetAsyncError). Past
// the timeout, or on such an error, it aborts the backend (ncclCommAbort: its kernels end, so the
// streams waiting on them go on), keeps the error naming the rank, the step and the collective,
// and the owner's next call throws it (rethrow). If nobody takes it within the grace period (the
// host stuck where no call comes), the watchdog prints it and ends the process with status 1,
// so the job fails with the message rather than hanging. PyTorch's ProcessGroupNCCL has the
// same thread. A call's clock starts when it is queued, and the host may queue ahead of the GPU
// (a pipeline's whole step, between two reads of a loss): parallel.timeout_s bounds that too.
//
// Plain C++: tests watch work whose completion they decide (tests/parallel/test_watchdog.cpp).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace ht {

class Watchdog {
 public:
  struct Backend {
    // The backend's asynchronous error in words, "" while none. Called on the watchdog's thread.
    std::function<std::string()> error;
    // Ends the backend's work in flight, once, on the watchdog's thread.
    std::function<void()> abort;
    // Run first on the watchdog's thread (cudaSetDevice).
    std::function<void()> start;
  };
  // `timeout_s`: how long one watched call may take (parallel.timeout_s). `grace_s`: how long a
  // failure may wait to be taken before the process ends (<= 0: never, for tests).
  Watchdog(double timeout_s, Backend backend, double grace_s, double poll_s = 0.0005);
  // Stops the thread; what is still watched is left as it is. A failure nobody took is printed
  // and, unless an exception is unwinding (the owner is failing already) or grace_s <= 0, ends
  // the process with status 1: a run whose last calls failed must not end as if it had not.
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Watches a call under way from now: `done` says, never blocking, whether it has completed (it
  // is not called again once it said so); `what` names it in the error ("rank 3, step 12: the
  // all-reduce of the gradients (NCCL, cuda:0)").
  void watch(std::string what, std::function<bool()> done);
  // Throws the failure (CommunicationError), if there was one; it stays, so every later call
  // throws it too.
  void rethrow();
  // Until everything watched now has completed, on the host; throws the failure if there is one.
  void wait_all();
  // The same for at most `seconds`, throwing nothing: whether everything ended without failure.
  bool wait_all_for(double seconds);
  size_t in_flight();
  bool failed();
  // For calls watched from now on; a grace period > 0 follows it.
  void set_timeout(double seconds);

 private:
  struct Watched {
    std::string what;
    std::function<bool()> done;
    std::chrono::steady_clock::time_point since;
    double timeout_s = 0;
  };
  void serve();
  // Drops what has completed; returns the failure found, "" if none. Called without the lock.
  std::string check(std::deque<Watched>& watched);
  void fail(const std::string& message);

  std::atomic<double> timeout_s_;
  std::atomic<double> grace_s_;
  const double poll_s_;
  Backend backend_;
  std::mutex mutex_;
  std::condition_variable wake_, settled_;
  std::deque<Watched> queued_;  // new since the thread last looked
  size_t in_flight_ = 0;
  std::string failure_;
  bool taken_ = false, stop_ = false;
  std::thread thread_;
};

}  // namespace ht

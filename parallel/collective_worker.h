#pragma once
// A thread that runs a group's all-reduces in the order they were queued, so that the thread
// running backward goes on computing meanwhile (parallel/data_parallel.h). The communicator must
// accept calls from a thread other than the main one (Communicator::allows_worker_thread()), and
// its owner must not call it itself until wait() has returned: calls are serialized, never
// concurrent. The worker touches only the tensors it was given, in place: it allocates nothing,
// so a memory budget's arena sees no allocation from it.

#include "parallel/communicator.h"

#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

namespace ht {

class CollectiveWorker {
 public:
  explicit CollectiveWorker(std::shared_ptr<Communicator> group);
  // Joins the thread, or, when a collective is still running (training failed on this rank and
  // the job is being aborted), leaves it to end with the process.
  ~CollectiveWorker();
  CollectiveWorker(const CollectiveWorker&) = delete;
  CollectiveWorker& operator=(const CollectiveWorker&) = delete;

  // Queues: sum `t` (contiguous) over the group in place, then multiply it by `scale`. `t` must not
  // be touched until wait() returns.
  void allreduce(at::Tensor t, double scale, const char* what);
  // Until everything queued is done; rethrows the first error. Returns the milliseconds the
  // worker spent in collectives since the previous wait().
  double wait();

 private:
  struct Job {
    at::Tensor tensor;
    double scale = 1;
    const char* what = "";
  };
  // Shared with the thread, so that a detached thread never outlives what it uses.
  struct State {
    std::mutex mutex;
    std::condition_variable wake, done;
    std::deque<Job> queue;
    bool running = false;  // a job is in the communicator
    bool stop = false;
    std::exception_ptr error;
    double busy_ms = 0;
  };
  static void serve(const std::shared_ptr<State>& state, const std::shared_ptr<Communicator>& group);

  std::shared_ptr<State> state_;
  std::thread thread_;
};

}  // namespace ht

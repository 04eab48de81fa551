#pragma once
// CPU ranks' CollectiveQueue (parallel/collective_queue.h): a thread that runs a group's
// collectives in the order they were queued, so that the thread
// running forward and backward goes on computing meanwhile: DataParallel's all-reduces during
// backward (parallel/data_parallel.h), sharded parameters' prefetched all-gathers and the
// reduce-scatters beside them (parallel/parameter_shards.h). The communicator must accept calls
// from a thread other than the main one (Communicator::allows_worker_thread()), and while anything
// queued has not completed, every other call into MPI must go through the same worker: calls are
// serialized, never concurrent, and every rank issues its collectives in the one order it queues
// them in. The worker touches only the tensors it was given, in place: it allocates nothing, so a
// memory budget's arena sees no allocation from it.

#include "parallel/collective_queue.h"
#include "parallel/communicator.h"

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace ht {

// t *= scale without ATen on host memory (a scalar argument would allocate a tensor, on the
// calling thread, from the budget's arena): fp32 and double exactly as ATen's mul_, bf16
// multiplied in fp32 and rounded once. On a device, ATen's mul_. Every path that turns a sum of
// gradients into their mean takes it, so the worker's and the inline path's bits agree.
void scale_in_place(at::Tensor& t, double scale);

class CollectiveWorker final : public CollectiveQueue {
 public:
  explicit CollectiveWorker(std::shared_ptr<Communicator> group);
  // Joins the thread, or, when a collective is still running (training failed on this rank and
  // the job is being aborted), leaves it to end with the process.
  ~CollectiveWorker();
  CollectiveWorker(const CollectiveWorker&) = delete;
  CollectiveWorker& operator=(const CollectiveWorker&) = delete;

  // CollectiveQueue's, on the worker: wait_for and wait block this thread until the jobs are done
  // and return how long it waited; wait() returns the milliseconds the worker spent in
  // collectives since the previous wait().
  void allreduce(at::Tensor t, double scale, const char* what) override;
  uint64_t submit(std::function<void(Communicator&)> run) override;
  double wait_for(uint64_t ticket) override;
  double wait() override;

 private:
  struct Job {
    at::Tensor tensor;
    double scale = 1;
    const char* what = "";
    std::function<void(Communicator&)> run;  // set: a submitted job, instead of the all-reduce
    uint64_t ticket = 0;
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
    uint64_t queued = 0, completed = 0;  // tickets: jobs queued, and done, since the start
  };
  uint64_t enqueue(Job job);
  std::exception_ptr take_error();
  static void serve(const std::shared_ptr<State>& state, const std::shared_ptr<Communicator>& group);

  std::shared_ptr<State> state_;
  std::thread thread_;
};

}  // namespace ht

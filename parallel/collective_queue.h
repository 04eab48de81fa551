#pragma once
// Where a group's collectives go while the thread running forward and backward goes on
// computing: DataParallel's all-reduces during backward (parallel/data_parallel.h), sharded
// parameters' prefetched all-gathers and the reduce-scatters beside them
// (parallel/parameter_shards.h, parallel/gradient_shards.h). Chosen once per group
// (make_collective_queue):
// - on CPU ranks, a thread that runs the jobs in order and is waited for on the host
//   (parallel/collective_worker.h);
// - on a GPU whose communicator has a communication stream of its own (NCCL's replicas), the
//   jobs are queued on that stream as they are submitted and the compute stream waits for them on
//   events; the host never does (parallel/stream_collectives.h).
// Every rank submits its jobs in one order, and jobs run in it. A job's tensors are its owner's,
// alive and untouched (but for the job) until the job is waited for; the job's copies of them keep
// them alive after that until the collective is done.

#include "parallel/communicator.h"

#include <cstdint>
#include <functional>
#include <memory>

namespace ht {

class CollectiveQueue {
 public:
  virtual ~CollectiveQueue() = default;
  // Queues: sum `t` (contiguous) over the group in place, then multiply it by `scale`.
  virtual void allreduce(at::Tensor t, double scale, const char* what) = 0;
  // Queues `run` (collectives on the group, and kernels on their results); returns its ticket.
  virtual uint64_t submit(std::function<void(Communicator&)> run) = 0;
  // Until what this rank computes next may read the results of the job with `ticket` (and of every
  // job queued before it); rethrows the first error. Returns the milliseconds the host waited.
  virtual double wait_for(uint64_t ticket) = 0;
  // Queues `run` and waits for it: a collective in its turn (the caller's own collectives while
  // the queue may be busy).
  void run(std::function<void(Communicator&)> run) { wait_for(submit(std::move(run))); }
  // As wait_for, for everything queued; returns the milliseconds spent in collectives since the
  // previous wait() where the queue measures them (timed()), else 0.
  virtual double wait() = 0;
  // Whether the host sees the collectives' time (a worker thread's), or not (a GPU stream's).
  virtual bool timed() const { return true; }
};

// The queue `group` takes: its communication stream's where it has one (Communicator::side_stream),
// else a worker thread where its communicator accepts calls from one (allows_worker_thread); null
// where neither.
std::shared_ptr<CollectiveQueue> make_collective_queue(std::shared_ptr<Communicator> group);

}  // namespace ht

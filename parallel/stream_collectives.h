#pragma once
// Collectives on a communication stream, waited for by the compute stream, never the host (issue
// 67; DESIGN: "streams and order, owned in one place"). A job runs on the host as it is
// submitted, with the communication stream as ATen's current stream: its collectives and the
// kernels after them (a scale, an uneven shard's copies) are queued there, behind an event of the
// compute stream's (the kernels that made its inputs), and the host goes on. wait_for makes the
// compute stream wait for the job's event; the kernels queued after that read its results.
// - A job holds its tensors (its function's copies of them) until its event has passed, so the
//   arena does not hand their blocks to the compute stream while the collective still uses them;
//   what a job allocates on the communication stream goes back only after that stream's event
//   at its free (alloc/deferred_frees.h).
// - Failures come from the communicator's watchdog (parallel/watchdog.h), at the next wait.
// The stream is an interface: NCCL's communicator gives the CUDA one (parallel/nccl_communicator.h);
// tests give one whose events pass when they say.

#include "alloc/deferred_frees.h"
#include "parallel/collective_queue.h"

#include <deque>
#include <memory>

namespace ht {

class SideStream {
 public:
  virtual ~SideStream() = default;
  // What is queued on this stream from now on follows what the compute stream has queued so far.
  virtual void follow_compute() = 0;
  // While the returned guard lives, this thread's kernels are queued on this stream.
  virtual std::shared_ptr<void> enter() = 0;
  // A fence after everything queued on this stream so far.
  virtual std::shared_ptr<Fence> record() = 0;
  // The compute stream's next kernel waits for `fence`; the host does not.
  virtual void compute_waits(Fence& fence) = 0;
};

class StreamCollectives final : public CollectiveQueue {
 public:
  StreamCollectives(std::shared_ptr<Communicator> group, std::shared_ptr<SideStream> stream);
  // Waits, on the host, for what is still under way: its tensors may be freed after.
  ~StreamCollectives() override;
  void allreduce(at::Tensor t, double scale, const char* what) override;
  uint64_t submit(std::function<void(Communicator&)> run) override;
  // The compute stream waits for the job's event; returns 0 (the host does not wait).
  double wait_for(uint64_t ticket) override;
  // The stream's time is not measured here: 0.
  double wait() override;
  // Jobs whose event has not passed yet (their tensors held).
  size_t held() const { return jobs_.size(); }

 private:
  struct Job {
    uint64_t ticket = 0;
    std::shared_ptr<Fence> done;
    std::function<void(Communicator&)> run;  // holds the job's tensors
  };
  // Lets go of the jobs whose event has passed.
  void reap();

  std::shared_ptr<Communicator> group_;
  std::shared_ptr<SideStream> stream_;
  std::deque<Job> jobs_;
  uint64_t queued_ = 0;
};

}  // namespace ht

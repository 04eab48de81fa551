#pragma once
// Collectives on a communication stream, waited for by the compute stream, never the host (issue
// 67; DESIGN: "streams and order, owned in one place"). A job runs on the host as it is
// submitted, with the communication stream as ATen's current stream: its collectives and the
// kernels after them (a scale, an uneven shard's copies) are queued there, behind an event of the
// compute stream's (the kernels that made its inputs), and the host goes on. wait_for makes the
// compute stream wait for the job's event; the kernels queued after that read its results.
// - A job holds its tensors (its function's copies of them) until the compute stream has been
//   made to wait for its event (wait_for, wait) or the event has passed: a block freed after that
//   is reused by the compute stream only behind the event, and by the communication stream only
//   behind the compute stream (each job follows it). So the blocks held are those of jobs not yet
//   waited for, at points of the program, whatever the GPU's pace. What a job allocates on the
//   communication stream goes back only after that stream's event at its free
//   (alloc/deferred_frees.h).
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
  // Waits, on the host, for the jobs that still hold tensors: they may be freed after. While an
  // exception unwinds (this rank is failing), it waits for nothing and leaves their tensors
  // allocated: a collective whose peers never come would hold the error up for the timeout.
  ~StreamCollectives() override;
  void allreduce(at::Tensor t, double scale, const char* what) override;
  uint64_t submit(std::function<void(Communicator&)> run) override;
  // The compute stream waits for the job's event; returns 0 (the host does not wait).
  double wait_for(uint64_t ticket) override;
  // The stream's time is not measured here: 0.
  double wait() override;
  bool timed() const override { return false; }
  // Jobs that still hold their tensors (not waited for, and their event not passed).
  size_t held() const;

 private:
  struct Job {
    uint64_t ticket = 0;
    std::shared_ptr<Fence> done;
    std::function<void(Communicator&)> run;  // holds the job's tensors until waited for
  };
  // Lets go of the jobs whose event has passed.
  void reap();
  // The compute stream waits for the job with `ticket`; it and every job before it let go of
  // their tensors.
  void waited_for(uint64_t ticket);

  std::shared_ptr<Communicator> group_;
  std::shared_ptr<SideStream> stream_;
  std::deque<Job> jobs_;
  uint64_t queued_ = 0;
};

}  // namespace ht

#include "parallel/stream_collectives.h"

#include "parallel/collective_worker.h"

#include <ATen/ATen.h>

#include <exception>

namespace ht {

StreamCollectives::StreamCollectives(std::shared_ptr<Communicator> group, std::shared_ptr<SideStream> stream)
    : group_(std::move(group)), stream_(std::move(stream)) {
  TORCH_CHECK(group_ != nullptr && stream_ != nullptr, "StreamCollectives: a group and its stream");
}

StreamCollectives::~StreamCollectives() {
  if (std::uncaught_exceptions() > 0) {
    new std::deque<Job>(std::move(jobs_));  // kept allocated: the job is ending anyway
    return;
  }
  // A collective still under way reads or writes its tensors: they are let go once it is done
  // (a failed one ends when the watchdog aborts its communicator).
  for (Job& job : jobs_) {
    if (job.run) job.done->wait();
  }
}

size_t StreamCollectives::held() const {
  size_t n = 0;
  for (const Job& job : jobs_) n += job.run ? 1 : 0;
  return n;
}

void StreamCollectives::allreduce(at::Tensor t, double scale, const char* what) {
  TORCH_CHECK(t.is_contiguous(), "StreamCollectives: ", what, " must be contiguous");
  submit([t, scale, what](Communicator& group) mutable {
    group.allreduce_sum(t, what);
    if (scale != 1) scale_in_place(t, scale);
  });
}

uint64_t StreamCollectives::submit(std::function<void(Communicator&)> run) {
  reap();
  stream_->follow_compute();
  try {
    const std::shared_ptr<void> on_stream = stream_->enter();
    run(*group_);
  } catch (...) {
    // Part of it may be queued: its tensors stay held (until the queue goes; kept while failing).
    jobs_.push_back({++queued_, stream_->record(), std::move(run)});
    throw;
  }
  // A fence never fails to be made (without an event its stream was waited for on the host).
  jobs_.push_back({++queued_, stream_->record(), std::move(run)});
  return queued_;
}

void StreamCollectives::waited_for(uint64_t ticket) {
  // One stream runs the jobs in order: the job's event follows every earlier job's.
  for (Job& job : jobs_) {
    if (job.ticket == ticket) {
      stream_->compute_waits(*job.done);
      break;
    }
  }
  for (Job& job : jobs_) {
    if (job.ticket > ticket) break;
    job.run = nullptr;  // the compute stream is behind it now
  }
}

double StreamCollectives::wait_for(uint64_t ticket) {
  waited_for(ticket);
  group_->rethrow_async_failure();
  reap();
  return 0;
}

double StreamCollectives::wait() {
  if (!jobs_.empty()) waited_for(jobs_.back().ticket);
  group_->rethrow_async_failure();
  reap();
  return 0;
}

void StreamCollectives::reap() {
  while (!jobs_.empty() && jobs_.front().done->passed()) jobs_.pop_front();
}

std::shared_ptr<CollectiveQueue> make_collective_queue(std::shared_ptr<Communicator> group) {
  if (std::shared_ptr<SideStream> stream = group->side_stream()) {
    return std::make_shared<StreamCollectives>(std::move(group), std::move(stream));
  }
  if (group->allows_worker_thread()) return std::make_shared<CollectiveWorker>(std::move(group));
  return nullptr;
}

}  // namespace ht

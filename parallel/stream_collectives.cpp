#include "parallel/stream_collectives.h"

#include "parallel/collective_worker.h"

#include <ATen/ATen.h>

namespace ht {

StreamCollectives::StreamCollectives(std::shared_ptr<Communicator> group, std::shared_ptr<SideStream> stream)
    : group_(std::move(group)), stream_(std::move(stream)) {
  TORCH_CHECK(group_ != nullptr && stream_ != nullptr, "StreamCollectives: a group and its stream");
}

StreamCollectives::~StreamCollectives() {
  // A collective still under way reads or writes its tensors: they are let go once it is done
  // (a failed one ends when the watchdog aborts its communicator).
  for (Job& job : jobs_) job.done->wait();
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
  {
    const std::shared_ptr<void> on_stream = stream_->enter();
    run(*group_);
  }
  jobs_.push_back({++queued_, stream_->record(), std::move(run)});
  return queued_;
}

double StreamCollectives::wait_for(uint64_t ticket) {
  // One stream runs the jobs in order: the job's event follows every earlier job's.
  for (Job& job : jobs_) {
    if (job.ticket == ticket) {
      stream_->compute_waits(*job.done);
      break;
    }
  }
  group_->rethrow_async_failure();
  reap();
  return 0;
}

double StreamCollectives::wait() {
  if (!jobs_.empty()) stream_->compute_waits(*jobs_.back().done);
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

#include "parallel/collective_worker.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>

namespace ht {

void scale_in_place(at::Tensor& t, double scale) {
  if (!t.is_cpu()) {  // a device tensor (NCCL): a kernel on ATen's stream, after the all-reduce
    t.mul_(scale);
    return;
  }
  const int64_t n = t.numel();
  if (t.scalar_type() == at::kFloat) {
    float* x = t.data_ptr<float>();
    const float s = static_cast<float>(scale);
    for (int64_t i = 0; i < n; ++i) x[i] *= s;
  } else if (t.scalar_type() == at::kDouble) {
    double* x = t.data_ptr<double>();
    for (int64_t i = 0; i < n; ++i) x[i] *= scale;
  } else if (t.scalar_type() == at::kBFloat16) {
    // 16-bit gradients (training.gradient_dtype = "bf16"): multiplied in fp32, rounded once.
    at::BFloat16* x = t.data_ptr<at::BFloat16>();
    const float s = static_cast<float>(scale);
    for (int64_t i = 0; i < n; ++i) x[i] = at::BFloat16(static_cast<float>(x[i]) * s);
  } else {
    TORCH_CHECK(false, "scale_in_place: cannot scale ", t.scalar_type(), " tensors (float, double and bf16 can)");
  }
}


CollectiveWorker::CollectiveWorker(std::shared_ptr<Communicator> group) : state_(std::make_shared<State>()) {
  TORCH_CHECK(group->allows_worker_thread(), "CollectiveWorker: the ", group->backend(),
              " communicator does not accept calls from another thread");
  thread_ = std::thread([state = state_, group = std::move(group)] { serve(state, group); });
}

CollectiveWorker::~CollectiveWorker() {
  bool busy = false;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stop = true;
    busy = state_->running;
  }
  state_->wake.notify_all();
  // A collective still running waits for ranks that will not come: this rank is failing, and
  // joining would hang it until the watchdog's timeout instead of letting it abort the job now.
  if (busy) {
    thread_.detach();
  } else {
    thread_.join();
  }
}

uint64_t CollectiveWorker::enqueue(Job job) {
  uint64_t ticket = 0;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    ticket = job.ticket = ++state_->queued;
    state_->queue.push_back(std::move(job));
  }
  state_->wake.notify_one();
  return ticket;
}

void CollectiveWorker::allreduce(at::Tensor t, double scale, const char* what) {
  TORCH_CHECK(t.is_contiguous(), "CollectiveWorker: ", what, " must be contiguous");
  Job job;
  job.tensor = std::move(t);
  job.scale = scale;
  job.what = what;
  enqueue(std::move(job));
}

uint64_t CollectiveWorker::submit(std::function<void(Communicator&)> run) {
  Job job;
  job.run = std::move(run);
  return enqueue(std::move(job));
}

// With the lock held, after an error: what is still queued will not run (its collectives would
// wait for ranks that are ending too).
std::exception_ptr CollectiveWorker::take_error() {
  std::exception_ptr error = state_->error;
  state_->error = nullptr;
  state_->completed += state_->queue.size();
  state_->queue.clear();
  return error;
}

double CollectiveWorker::wait_for(uint64_t ticket) {
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(state_->mutex);
  state_->done.wait(lock, [&] { return state_->completed >= ticket || state_->error; });
  if (state_->error) std::rethrow_exception(take_error());
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

double CollectiveWorker::wait() {
  std::unique_lock<std::mutex> lock(state_->mutex);
  state_->done.wait(lock, [&] { return (state_->queue.empty() && !state_->running) || state_->error; });
  if (state_->error) std::rethrow_exception(take_error());
  const double ms = state_->busy_ms;
  state_->busy_ms = 0;
  return ms;
}

void CollectiveWorker::serve(const std::shared_ptr<State>& state, const std::shared_ptr<Communicator>& group) {
  std::unique_lock<std::mutex> lock(state->mutex);
  while (true) {
    state->wake.wait(lock, [&] { return state->stop || (!state->queue.empty() && !state->error); });
    if (state->stop) return;
    Job job = std::move(state->queue.front());
    state->queue.pop_front();
    state->running = true;
    lock.unlock();
    std::exception_ptr error;
    const auto start = std::chrono::steady_clock::now();
    try {
      if (job.run) {
        job.run(*group);
      } else {
        group->allreduce_sum(job.tensor, job.what);
        if (job.scale != 1) scale_in_place(job.tensor, job.scale);
      }
    } catch (...) {
      error = std::current_exception();
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    job.tensor.reset();  // the owner's tensor; let go before reporting done
    job.run = nullptr;
    lock.lock();
    state->running = false;
    state->completed = std::max(state->completed, job.ticket);
    state->busy_ms += ms;
    if (error && !state->error) state->error = error;
    state->done.notify_all();
  }
}

}  // namespace ht

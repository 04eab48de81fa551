#include "alloc/host_link.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace ht {
namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}


}  // namespace

bool ModelledCopy::done() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return copied_ && Clock::now() >= finished_;
}

double ModelledCopy::wait() {
  const Clock::time_point start = Clock::now();
  Clock::time_point finish;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (copied_ && start >= finished_) return 0;
    cv_.wait(lock, [&] { return copied_; });
    finish = finished_;
  }
  std::this_thread::sleep_until(finish);
  return ms_between(start, Clock::now());
}

Clock::time_point ModelledCopy::started() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return started_;
}

Clock::time_point ModelledCopy::finished() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return finished_;
}

CopyQueue::CopyQueue(double bytes_per_ms) : bytes_per_ms_(bytes_per_ms), worker_([this] { run(); }) {}

CopyQueue::~CopyQueue() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  worker_.join();
  // The worker moved every byte queued; a copy is done only once its modelled time has passed
  // too. Wait that out, so that no job outlives its link half done (CopyJob::done()).
  std::this_thread::sleep_until(free_at_);
}

void CopyQueue::push(const std::shared_ptr<ModelledCopy>& job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const Clock::time_point start = std::max(Clock::now(), free_at_);
    const double ms = bytes_per_ms_ > 0 ? static_cast<double>(job->bytes) / bytes_per_ms_ : 0;
    free_at_ = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(ms));
    {
      std::lock_guard<std::mutex> job_lock(job->mutex_);
      job->started_ = start;
      job->finished_ = free_at_;
    }
    queue_.push_back(job);
  }
  cv_.notify_all();
}

double CopyQueue::backlog_ms() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::max(0.0, ms_between(Clock::now(), free_at_));
}

LinkStats CopyQueue::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CopyQueue::run() {
  while (true) {
    std::shared_ptr<ModelledCopy> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything queued is done
      job = queue_.front();
      queue_.pop_front();
    }
    const Clock::time_point start = Clock::now();
    if (job->convert) {
      job->dst_.copy_(job->src_);
    } else {
      std::memcpy(job->dst_.data_ptr(), job->src_.storage().data(), static_cast<size_t>(job->bytes));
    }
    const Clock::time_point end = Clock::now();
    Clock::time_point started, finished;
    {
      std::lock_guard<std::mutex> lock(job->mutex_);
      started = job->started_;
      finished = job->finished_;
    }
    {  // counted before the job is done: whoever waits for it then sees it in stats()
      std::lock_guard<std::mutex> lock(mutex_);
      ++stats_.copies;
      stats_.late_ms += std::max(0.0, ms_between(finished, end));
      stats_.bytes += job->bytes;
      stats_.busy_ms += ms_between(started, finished);
      stats_.memcpy_ms += ms_between(start, end);
    }
    {
      std::lock_guard<std::mutex> lock(job->mutex_);
      job->copied_ = true;  // done once its modelled time has passed too
      // The ends go back to whoever else holds them (the caller frees them on its own thread).
      job->src_ = at::Tensor();
      job->dst_ = at::Tensor();
    }
    job->cv_.notify_all();
  }
}

int64_t checked_copy_bytes(const at::Tensor& src, const at::Tensor& dst) {
  const auto bytes = static_cast<int64_t>(src.storage().nbytes());
  TORCH_CHECK(dst.storage_offset() == 0 && dst.is_contiguous(), "HostLink::copy: the destination must be a whole storage");
  TORCH_CHECK(static_cast<int64_t>(dst.storage().nbytes()) >= bytes, "HostLink::copy: ", bytes,
              " bytes into a storage of ", dst.storage().nbytes());
  return bytes;
}

int64_t checked_convert_bytes(const at::Tensor& src, const at::Tensor& dst) {
  TORCH_CHECK(src.is_contiguous() && dst.is_contiguous() && src.numel() == dst.numel(),
              "HostLink::convert: contiguous tensors of as many elements, got ", src.numel(), " and ", dst.numel());
  return src.numel() * static_cast<int64_t>(std::min(src.element_size(), dst.element_size()));
}

ModelledHostLink::ModelledHostLink(double gbps) : gbps_(gbps), to_host_(gbps * 1e6), to_device_(gbps * 1e6) {}

at::Tensor ModelledHostLink::host_empty(int64_t elements, at::ScalarType dtype) {
  return at::empty({elements}, at::TensorOptions().dtype(dtype));
}

std::shared_ptr<CopyJob> ModelledHostLink::copy(CopyDirection direction, const at::Tensor& src, const at::Tensor& dst) {
  auto job = std::make_shared<ModelledCopy>(direction, src, dst, checked_copy_bytes(src, dst));
  queue(direction).push(job);
  return job;
}

std::shared_ptr<CopyJob> ModelledHostLink::convert(CopyDirection direction, const at::Tensor& src,
                                                   const at::Tensor& dst) {
  auto job = std::make_shared<ModelledCopy>(direction, src, dst, checked_convert_bytes(src, dst), /*convert=*/true);
  queue(direction).push(job);
  return job;
}

double measure_memcpy_gbps(int64_t bytes) {
  std::vector<char> a(static_cast<size_t>(bytes), 1), b(static_cast<size_t>(bytes), 0);
  std::memcpy(b.data(), a.data(), a.size());  // fault the pages in
  double best_ms = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const Clock::time_point start = Clock::now();
    std::memcpy(b.data(), a.data(), a.size());
    best_ms = std::min(best_ms, ms_between(start, Clock::now()));
  }
  return static_cast<double>(bytes) / (std::max(best_ms, 1e-3) * 1e6);
}

}  // namespace ht

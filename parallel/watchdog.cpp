#include "parallel/watchdog.h"

#include "parallel/communicator.h"

#include <cstdio>
#include <cstdlib>
#include <exception>

namespace ht {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

std::string seconds_text(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", s);
  return text;
}

}  // namespace

Watchdog::Watchdog(double timeout_s, Backend backend, double grace_s, double poll_s)
    : timeout_s_(timeout_s), grace_s_(grace_s), poll_s_(poll_s), backend_(std::move(backend)) {
  thread_ = std::thread([this] { serve(); });
}

Watchdog::~Watchdog() {
  std::string untaken;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    if (!taken_) untaken = failure_;
  }
  wake_.notify_all();
  thread_.join();
  if (untaken.empty()) return;
  std::fprintf(stderr, "hybrid_train: error: %s\n", untaken.c_str());
  std::fflush(stderr);
  if (grace_s_.load() > 0 && std::uncaught_exceptions() == 0) std::_Exit(1);
}

void Watchdog::set_timeout(double seconds) {
  timeout_s_.store(seconds);
  if (grace_s_.load() > 0) grace_s_.store(seconds);
}

void Watchdog::watch(std::string what, std::function<bool()> done) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queued_.push_back({std::move(what), std::move(done), std::chrono::steady_clock::now(), timeout_s_.load()});
    ++in_flight_;
  }
  wake_.notify_all();
}

void Watchdog::rethrow() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (failure_.empty()) return;
  taken_ = true;
  const std::string failure = failure_;
  lock.unlock();
  wake_.notify_all();
  throw CommunicationError(failure);
}

void Watchdog::wait_all() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    settled_.wait(lock, [&] { return in_flight_ == 0 || !failure_.empty(); });
  }
  rethrow();
}

bool Watchdog::wait_all_for(double seconds) {
  std::unique_lock<std::mutex> lock(mutex_);
  settled_.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return in_flight_ == 0 || !failure_.empty(); });
  return in_flight_ == 0 && failure_.empty();
}

size_t Watchdog::in_flight() {
  std::lock_guard<std::mutex> lock(mutex_);
  return in_flight_;
}

bool Watchdog::failed() {
  std::lock_guard<std::mutex> lock(mutex_);
  return !failure_.empty();
}

std::string Watchdog::check(std::deque<Watched>& watched) {
  std::deque<Watched> left;
  std::string failure;
  for (Watched& w : watched) {
    if (w.done()) continue;
    if (failure.empty() && seconds_since(w.since) > w.timeout_s) {
      failure = w.what + " not done after " + seconds_text(w.timeout_s) +
                " s (parallel.timeout_s): another rank has died or hangs";
    }
    left.push_back(std::move(w));
  }
  watched.swap(left);
  // The backend's error only while a call is under way: with none, the next call finds it (a peer
  // that ended its run first must not fail this one's last poll).
  if (!failure.empty() || watched.empty() || !backend_.error) return failure;
  const std::string error = backend_.error();
  if (!error.empty()) failure = watched.front().what + " failed: " + error;
  return failure;
}

void Watchdog::fail(const std::string& message) {
  // Aborted before the failure is seen: whoever takes it finds the backend's work ended.
  if (backend_.abort) backend_.abort();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    failure_ = message;
  }
  settled_.notify_all();
  // Until the owner takes it; past the grace period the process ends with the message.
  const auto since = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  while (!taken_ && !stop_) {
    const double grace = grace_s_.load();
    if (grace > 0 && seconds_since(since) > grace) {
      std::fprintf(stderr, "hybrid_train: error: %s (the training thread did not take this error in %.0f s: ending)\n",
                   message.c_str(), grace);
      std::fflush(stderr);
      std::_Exit(1);
    }
    wake_.wait_for(lock, std::chrono::milliseconds(100));
  }
}

void Watchdog::serve() {
  if (backend_.start) backend_.start();
  std::deque<Watched> watched;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (watched.empty()) wake_.wait(lock, [&] { return stop_ || !queued_.empty(); });
      if (stop_) return;
      for (Watched& w : queued_) watched.push_back(std::move(w));
      queued_.clear();
    }
    const std::string failure = check(watched);
    if (!failure.empty()) {
      fail(failure);
      return;  // the backend is aborted: nothing more completes
    }
    {
      std::unique_lock<std::mutex> lock(mutex_);
      in_flight_ = watched.size() + queued_.size();
      if (in_flight_ == 0) settled_.notify_all();
      if (!watched.empty()) wake_.wait_for(lock, std::chrono::duration<double>(poll_s_), [&] { return stop_; });
    }
  }
}

}  // namespace ht

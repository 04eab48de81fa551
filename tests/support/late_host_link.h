#pragma once
// A host link whose copies finish only when the test's rule says, or when a reader waits for one
// (issue 67: the fake link that proves host swap's discipline on a link as asynchronous as a
// GPU's copy engines). Until a copy finishes its destination holds NaN (every byte 0xFF), and it
// moves its source's bytes as they are when it finishes, not when it was asked for. So a value
// read before its copy came back reads NaN, and a source overwritten before its copy went out goes
// out wrong: either breaks bit-identity with the run without a budget. As HostLink's contract
// says, a copy holds both its ends until it is done, whoever else lets go of them (the CUDA link
// does so too: the arena's block goes back only after the copy stream's event).
// Single-threaded: the link's work happens in its caller's calls. Its wait() finishes the copy,
// as on CPU ranks, whose compute is the host: a GPU's wait() that only orders the compute stream
// (alloc/cuda_host_link.h) is not what this fake holds.

#include "alloc/host_link.h"

#include <ATen/ATen.h>

#include <cstring>
#include <deque>
#include <memory>

namespace ht::test {

class LateHostLink final : public HostLink, public std::enable_shared_from_this<LateHostLink> {
 public:
  // `lag`: a copy finishes once `lag` later copies were asked for in its direction (0: only when
  // waited for, or when the link goes). `gbps`: the rate the swap's rule prices copies by.
  explicit LateHostLink(int lag, double gbps = 50) : lag_(lag), gbps_(gbps) {}
  ~LateHostLink() override { finish_all(); }

  double gbps() const override { return gbps_; }
  at::Tensor host_empty(int64_t elements, at::ScalarType dtype) override {
    return at::empty({elements}, at::TensorOptions().dtype(dtype));
  }
  std::shared_ptr<CopyJob> copy(CopyDirection direction, const at::Tensor& src, const at::Tensor& dst) override {
    return push(direction, src, dst, checked_copy_bytes(src, dst), false);
  }
  std::shared_ptr<CopyJob> convert(CopyDirection direction, const at::Tensor& src, const at::Tensor& dst) override {
    return push(direction, src, dst, checked_convert_bytes(src, dst), true);
  }
  double backlog_ms(CopyDirection direction) const override {
    int64_t bytes = 0;
    for (const auto& job : pending(direction)) bytes += job->bytes;
    return transfer_ms(bytes);
  }
  LinkStats stats(CopyDirection direction) const override {
    return direction == CopyDirection::kToHost ? to_host_ : to_device_;
  }

  int64_t finished_late() const { return finished_late_; }  // copies finished after a later one was asked for
  void finish_all() {
    for (CopyDirection d : {CopyDirection::kToHost, CopyDirection::kToDevice}) {
      while (!pending(d).empty()) finish_oldest(d);
    }
  }

 private:
  class Copy final : public CopyJob {
   public:
    Copy(LateHostLink& link, CopyDirection direction, at::Tensor src, at::Tensor dst, int64_t bytes, bool convert)
        : CopyJob(direction, bytes, convert), link_(link), src(std::move(src)), dst(std::move(dst)),
          asked(std::chrono::steady_clock::now()) {}
    bool done() const override { return finished_; }
    double wait() override {
      if (finished_) return 0;
      while (!finished_) link_.finish_oldest(direction);  // in order, as a stream runs them
      return 1e-3;  // the host waited: the copy was not hidden
    }
    std::chrono::steady_clock::time_point started() const override { return asked; }
    std::chrono::steady_clock::time_point finished() const override { return finished_at; }

    LateHostLink& link_;
    at::Tensor src, dst;
    std::chrono::steady_clock::time_point asked, finished_at;
    bool finished_ = false;
  };

  std::deque<std::shared_ptr<Copy>>& pending(CopyDirection d) { return d == CopyDirection::kToHost ? out_ : in_; }
  const std::deque<std::shared_ptr<Copy>>& pending(CopyDirection d) const {
    return d == CopyDirection::kToHost ? out_ : in_;
  }

  std::shared_ptr<CopyJob> push(CopyDirection direction, const at::Tensor& src, const at::Tensor& dst, int64_t bytes,
                                bool convert) {
    std::memset(dst.storage().data(), 0xFF, dst.storage().nbytes());  // NaN until the copy finishes
    auto job = std::make_shared<Copy>(*this, direction, src, dst, bytes, convert);
    auto& queue = pending(direction);
    queue.push_back(job);
    if (lag_ > 0) {
      while (static_cast<int>(queue.size()) > lag_) {
        ++finished_late_;
        finish_oldest(direction);
      }
    }
    return job;
  }

  void finish_oldest(CopyDirection direction) {
    auto& queue = pending(direction);
    std::shared_ptr<Copy> job = queue.front();
    queue.pop_front();
    if (job->convert) {
      job->dst.copy_(job->src);
    } else {
      std::memcpy(job->dst.data_ptr(), job->src.storage().data(), static_cast<size_t>(job->bytes));
    }
    job->src = at::Tensor();
    job->dst = at::Tensor();
    job->finished_at = std::chrono::steady_clock::now();
    job->finished_ = true;
    LinkStats& s = direction == CopyDirection::kToHost ? to_host_ : to_device_;
    ++s.copies;
    s.bytes += job->bytes;
    s.busy_ms += transfer_ms(job->bytes);
  }

  const int lag_;
  const double gbps_;
  std::deque<std::shared_ptr<Copy>> out_, in_;
  LinkStats to_host_, to_device_;
  int64_t finished_late_ = 0;
};

}  // namespace ht::test

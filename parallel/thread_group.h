#pragma once
// A tensor-parallel group of threads in one process (runtime/tensor_parallel.h): each thread is a
// rank with its own interpreter (and memory manager), so split layers and models are tested and
// measured against the unsplit ones without mpirun (tests/, bench/tensor_parallel). Every rank
// sums in rank order, so all ranks see the same bits. Not for training: a rank that throws
// between two collectives leaves the others waiting.

#include "runtime/tensor_parallel.h"

#include <ATen/ATen.h>

#include <condition_variable>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace ht {

class ThreadGroupState {
 public:
  explicit ThreadGroupState(int size) : size_(size), slots_(static_cast<size_t>(size)) {}
  int size() const { return size_; }
  void barrier() {
    std::unique_lock<std::mutex> lock(mutex_);
    const uint64_t generation = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      changed_.notify_all();
    } else {
      changed_.wait(lock, [&] { return generation_ != generation; });
    }
  }
  std::vector<at::Tensor>& slots() { return slots_; }

 private:
  int size_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::vector<at::Tensor> slots_;
};

class ThreadGroup final : public TensorParallelGroup {
 public:
  ThreadGroup(std::shared_ptr<ThreadGroupState> state, int rank) : state_(std::move(state)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return state_->size(); }
  void allreduce_sum(at::Tensor& t, const char* what) override {
    by_use_[what] += t.numel();
    state_->slots()[rank_] = t;
    state_->barrier();
    at::Tensor sum = state_->slots()[0].clone();
    for (int r = 1; r < size(); ++r) sum.add_(state_->slots()[r]);
    state_->barrier();
    t.copy_(sum);
    allreduce_elements_ += t.numel();
  }
  void all_gather(const at::Tensor& shard, at::Tensor& full, const char* what) override {
    by_use_[what] += full.numel();
    state_->slots()[rank_] = shard;
    state_->barrier();
    const int64_t n = shard.numel();
    for (int r = 0; r < size(); ++r) full.narrow(0, r * n, n).copy_(state_->slots()[r].view(-1));
    state_->barrier();
    allgather_elements_ += full.numel();
  }
  void reduce_scatter_sum(const at::Tensor& full, at::Tensor& shard, const char* what) override {
    by_use_[what] += full.numel();
    state_->slots()[rank_] = full;
    state_->barrier();
    const int64_t n = shard.numel();
    at::Tensor sum = state_->slots()[0].narrow(0, rank_ * n, n).clone();
    for (int r = 1; r < size(); ++r) sum.add_(state_->slots()[r].narrow(0, rank_ * n, n));
    state_->barrier();
    shard.view(-1).copy_(sum);
    reducescatter_elements_ += full.numel();
  }
  // Exchanged at once (threads): the pass is complete when it returns.
  std::unique_ptr<RingPass> pass_along_ring(const at::Tensor& out, at::Tensor& in, const char* what) override {
    by_use_[what] += out.numel();
    state_->slots()[rank_] = out;
    state_->barrier();
    in.copy_(state_->slots()[(rank_ + size() - 1) % size()]);
    state_->barrier();
    struct Done final : RingPass {
      void wait() override {}
    };
    return std::make_unique<Done>();
  }
  // Elements handed to collectives so far (an all-reduce's tensor, a gather's or scatter's whole).
  int64_t allreduce_elements() const { return allreduce_elements_; }
  int64_t allgather_elements() const { return allgather_elements_; }
  int64_t reducescatter_elements() const { return reducescatter_elements_; }
  // The same by use (the ops' `what`: "g's all-reduce (forward)", ...).
  const std::map<std::string, int64_t>& elements_by_use() const { return by_use_; }

 private:
  std::shared_ptr<ThreadGroupState> state_;
  int rank_;
  int64_t allreduce_elements_ = 0, allgather_elements_ = 0, reducescatter_elements_ = 0;
  std::map<std::string, int64_t> by_use_;
};

// Runs body(rank, group) on `size` threads at once; rethrows the first rank's exception.
inline void run_ranks(int size, const std::function<void(int, ThreadGroup&)>& body) {
  auto state = std::make_shared<ThreadGroupState>(size);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      ThreadGroup group(state, r);
      try {
        body(r, group);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace ht

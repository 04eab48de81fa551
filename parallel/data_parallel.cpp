#include "parallel/data_parallel.h"
#include "base/clock.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>

namespace ht {

DataParallel::DataParallel(std::shared_ptr<Communicator> group, std::vector<at::Tensor> params, int64_t bucket_bytes,
                           bool overlap, const std::vector<int>& units)
    : group_(std::move(group)), params_(std::move(params)), had_here_(params_.size(), 0.0f) {
  TORCH_CHECK(bucket_bytes > 0, "DataParallel: bucket size must be positive");
  TORCH_CHECK(units.empty() || units.size() == params_.size(), "DataParallel: one unit per parameter");
  // Reverse order: the last layers' gradients are ready first. A parameter larger than a bucket
  // gets a bucket of its own; parameters of another dtype than the bucket's start a new one.
  std::vector<std::vector<size_t>> groups;
  std::vector<size_t> bucket;
  int64_t bytes = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    const at::Tensor& p = params_[k];
    if (!p.requires_grad()) continue;
    const int64_t nbytes = static_cast<int64_t>(p.nbytes());
    const bool other_type = !bucket.empty() && params_[bucket.front()].scalar_type() != p.scalar_type();
    const bool other_unit = !bucket.empty() && !units.empty() && units[bucket.front()] != units[k];
    if (!bucket.empty() && (bytes + nbytes > bucket_bytes || other_type || other_unit)) {
      groups.push_back(std::move(bucket));
      bucket.clear();
      bytes = 0;
    }
    bucket.push_back(k);
    bytes += nbytes;
  }
  if (!bucket.empty()) groups.push_back(std::move(bucket));
  for (std::vector<size_t>& members : groups) {
    for (size_t k : members) bucket_of_[params_[k].unsafeGetTensorImpl()] = buckets_.size();
    buckets_.push_back(Bucket{std::move(members), {}, {}, 0});
  }
  if (overlap && size() > 1) worker_ = make_collective_queue(group_);
}

std::vector<at::Tensor> DataParallel::reduction_order() const {
  std::vector<at::Tensor> order;
  for (const Bucket& b : buckets_)
    for (size_t k : b.members) order.push_back(params_[k]);
  return order;
}

std::vector<std::vector<size_t>> DataParallel::buckets() const {
  std::vector<std::vector<size_t>> members;
  for (const Bucket& b : buckets_) members.push_back(b.members);
  return members;
}

std::vector<std::vector<int64_t>> DataParallel::bucket_elements() const {
  std::vector<std::vector<int64_t>> out;
  for (const Bucket& b : buckets_) {
    out.emplace_back();
    for (size_t k : b.members) out.back().push_back(params_[k].numel());
  }
  return out;
}

void DataParallel::use_gradient_buffer(const GradientBuffer* buffer) {
  buffer_ = buffer;
  for (Bucket& b : buckets_) {
    b.span = at::Tensor();
    if (buffer_ == nullptr) continue;
    std::vector<at::Tensor> members;
    for (size_t k : b.members) members.push_back(params_[k]);
    b.span = buffer_->span(members);
  }
}

void DataParallel::broadcast_state(const std::vector<at::Tensor>& buffers) {
  if (size() == 1) return;
  at::NoGradGuard no_grad;
  auto send = [&](const at::Tensor& t, const char* what) {
    at::Tensor flat = t.contiguous();
    group_->broadcast(flat, 0, what);
    if (!flat.is_same(t)) t.copy_(flat);
  };
  for (const at::Tensor& p : params_) send(p.detach(), "the parameters");
  for (const at::Tensor& b : buffers) send(b, "the buffers");
}

void DataParallel::backward_begins(const std::vector<const c10::TensorImpl*>& pending) {
  if (size() == 1) return;
  TORCH_CHECK(next_ == 0, "DataParallel: a second backward before average_gradients(); listen to the last "
              "micro-batch's backward only");
  for (Bucket& b : buckets_) b.pending = 0;
  for (const c10::TensorImpl* impl : pending) {
    auto it = bucket_of_.find(impl);
    if (it != bucket_of_.end()) ++buckets_[it->second].pending;
  }
  start_ready_buckets();  // parameters this backward does not reach are final already
}

void DataParallel::gradient_ready(const at::Tensor& param) {
  if (size() == 1) return;
  auto it = bucket_of_.find(param.unsafeGetTensorImpl());
  if (it == bucket_of_.end()) return;
  --buckets_[it->second].pending;
  start_ready_buckets();
}

void DataParallel::start_ready_buckets() {
  // In bucket order only: every rank then issues the same collectives in the same order.
  while (next_ < buckets_.size() && buckets_[next_].pending <= 0) start(buckets_[next_++]);
}

void DataParallel::start(Bucket& b) {
  at::NoGradGuard no_grad;
  for (size_t k : b.members) had_here_[k] = params_[k].grad().defined() ? 1.0f : 0.0f;
  if (b.span.defined()) {
    // In place: a gradient already in its slot stays there; one elsewhere is copied in; a
    // parameter without one takes part with zeros.
    for (size_t k : b.members) {
      const at::Tensor slot = buffer_->slot(params_[k]);
      const at::Tensor& g = params_[k].grad();
      if (!g.defined()) {
        at::Tensor(slot).zero_();
      } else if (g.data_ptr() != slot.data_ptr()) {
        at::Tensor(slot).copy_(g);
      }
    }
    b.flat = b.span;
  } else {
    std::vector<at::Tensor> pieces;
    pieces.reserve(b.members.size());
    for (size_t k : b.members) {
      const at::Tensor& g = params_[k].grad();
      pieces.push_back(g.defined() ? g.reshape({-1}) : at::zeros({params_[k].numel()}, params_[k].options()));
    }
    b.flat = at::cat(pieces);
  }
  bytes_ += static_cast<int64_t>(b.flat.nbytes());
  reduce(b.flat, "the gradients");
}

void DataParallel::reduce(at::Tensor flat, const char* what) {
  const double inverse = 1.0 / static_cast<double>(size());
  if (worker_) {
    worker_->allreduce(std::move(flat), inverse, what);
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  group_->allreduce_sum(flat, what);
  inline_ms_ += ms_since(start);
  scale_in_place(flat, inverse);
}

void DataParallel::begin_average() {
  stats_ = {};
  if (size() == 1) return;
  at::NoGradGuard no_grad;
  stats_.buckets = static_cast<int64_t>(buckets_.size());
  stats_.started_in_backward = static_cast<int64_t>(next_);
  while (next_ < buckets_.size()) start(buckets_[next_++]);
  // Whether each parameter had a gradient on some rank: one more small all-reduce per step, so
  // that a parameter no rank touched keeps no gradient. Means of 1s: > 0 iff some rank had one.
  had_anywhere_ = at::tensor(had_here_);
  reduce(had_anywhere_, "the gradient flags");
}

void DataParallel::finish_average() {
  if (size() == 1) return;
  at::NoGradGuard no_grad;
  const auto waiting = std::chrono::steady_clock::now();
  stats_.comm_ms = worker_ ? worker_->wait() : inline_ms_;
  stats_.wait_ms = worker_ ? ms_since(waiting) : inline_ms_;
  stats_.comm_bytes = bytes_;
  stats_.overlap = stats_.comm_ms > 0 ? std::clamp(1.0 - stats_.wait_ms / stats_.comm_ms, 0.0, 1.0) : 0.0;
  if (worker_ && !worker_->timed()) stats_.comm_ms = stats_.overlap = -1;  // on a GPU's stream: not seen
  write_means(had_anywhere_);
  had_anywhere_ = at::Tensor();
  reset_step();
}

void DataParallel::write_means(const at::Tensor& had_anywhere) {
  const float* had = had_anywhere.data_ptr<float>();
  for (Bucket& b : buckets_) {
    int64_t offset = 0;
    for (size_t k : b.members) {
      at::Tensor p = params_[k];
      const int64_t n = p.numel();
      if (had[k] > 0) {
        at::Tensor mean = b.flat.narrow(0, offset, n).view(p.sizes());
        if (b.span.defined()) {
          p.mutable_grad() = mean;  // its slot
        } else if (p.grad().defined()) {
          p.mutable_grad().copy_(mean);
        } else {
          p.mutable_grad() = mean.clone();
        }
      }
      offset += n;
    }
  }
}

void DataParallel::reset_step() {
  for (Bucket& b : buckets_) {
    b.flat = at::Tensor();
    b.pending = 0;
  }
  std::fill(had_here_.begin(), had_here_.end(), 0.0f);
  next_ = 0;
  inline_ms_ = 0;
  bytes_ = 0;
}

double DataParallel::mean(double value, const char* what) {
  if (size() == 1) return value;
  at::Tensor t = at::full({1}, value, at::kDouble);
  group_->allreduce_sum(t, what);
  return t.item<double>() / static_cast<double>(size());
}

}  // namespace ht

#include "parallel/data_parallel.h"

#include <ATen/ATen.h>

#include <chrono>

namespace ht {

DataParallel::DataParallel(std::shared_ptr<Communicator> group, std::vector<at::Tensor> params, int64_t bucket_bytes)
    : group_(std::move(group)), params_(std::move(params)) {
  TORCH_CHECK(bucket_bytes > 0, "DataParallel: bucket size must be positive");
  // Reverse order: the last layers' gradients are ready first. A parameter larger than a bucket
  // gets a bucket of its own; parameters of another dtype than the bucket's start a new one.
  std::vector<size_t> bucket;
  int64_t bytes = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    const at::Tensor& p = params_[k];
    const int64_t nbytes = static_cast<int64_t>(p.nbytes());
    const bool other_type = !bucket.empty() && params_[bucket.front()].scalar_type() != p.scalar_type();
    if (!bucket.empty() && (bytes + nbytes > bucket_bytes || other_type)) {
      buckets_.push_back(std::move(bucket));
      bucket.clear();
      bytes = 0;
    }
    bucket.push_back(k);
    bytes += nbytes;
  }
  if (!bucket.empty()) buckets_.push_back(std::move(bucket));
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

void DataParallel::average_gradients() {
  stats_ = {};
  if (size() == 1) return;
  at::NoGradGuard no_grad;
  const double inverse = 1.0 / static_cast<double>(size());
  for (const std::vector<size_t>& bucket : buckets_) {
    std::vector<at::Tensor> pieces;
    pieces.reserve(bucket.size() + 1);
    for (size_t k : bucket) {
      const at::Tensor& g = params_[k].grad();
      pieces.push_back(g.defined() ? g.reshape({-1}) : at::zeros({params_[k].numel()}, params_[k].options()));
    }
    // One more element per parameter: whether this rank had a gradient for it, so that a
    // parameter no rank touched keeps no gradient.
    std::vector<float> had_here(bucket.size());
    for (size_t i = 0; i < bucket.size(); ++i) had_here[i] = params_[bucket[i]].grad().defined() ? 1.0f : 0.0f;
    pieces.push_back(at::tensor(had_here).to(params_[bucket.front()].options()));
    at::Tensor flat = at::cat(pieces);
    const auto start = std::chrono::steady_clock::now();
    group_->allreduce_sum(flat, "the gradients");
    stats_.comm_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    stats_.comm_bytes += static_cast<int64_t>(flat.nbytes());
    const int64_t count = static_cast<int64_t>(bucket.size());
    const at::Tensor had = flat.narrow(0, flat.numel() - count, count).to(at::kCPU, at::kFloat).contiguous();
    const float* had_anywhere = had.data_ptr<float>();
    int64_t offset = 0;
    for (size_t i = 0; i < bucket.size(); ++i) {
      at::Tensor p = params_[bucket[i]];
      const int64_t n = p.numel();
      if (had_anywhere[i] > 0) {
        at::Tensor mean = flat.narrow(0, offset, n).view(p.sizes()).mul_(inverse);
        if (p.grad().defined()) {
          p.mutable_grad().copy_(mean);
        } else {
          p.mutable_grad() = mean.clone();
        }
      }
      offset += n;
    }
  }
}

double DataParallel::mean(double value, const char* what) {
  if (size() == 1) return value;
  at::Tensor t = at::full({1}, value, at::kDouble);
  group_->allreduce_sum(t, what);
  return t.item<double>() / static_cast<double>(size());
}

}  // namespace ht

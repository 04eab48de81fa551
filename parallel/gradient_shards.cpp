#include "parallel/gradient_shards.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>

namespace ht {

GradientShards::GradientShards(std::shared_ptr<Communicator> group, std::vector<at::Tensor> params,
                               const std::vector<std::vector<size_t>>& buckets,
                               std::optional<at::ScalarType> floating)
    : group_(std::move(group)), params_(std::move(params)), floating_(floating), had_here_(params_.size(), 0.0f),
      had_anywhere_(params_.size(), 0.0f) {
  const auto rank = static_cast<size_t>(group_->rank());
  for (const std::vector<size_t>& members : buckets) {
    Bucket b;
    b.members = members;
    std::vector<int64_t> elements;
    int64_t offset = 0;
    for (size_t m = 0; m < members.size(); ++m) {
      const at::Tensor& p = params_[members[m]];
      TORCH_CHECK(p.is_non_overlapping_and_dense(), "GradientShards: a parameter with gaps in its layout");
      TORCH_CHECK(p.scalar_type() == params_[members.front()].scalar_type(), "GradientShards: a bucket of two dtypes");
      where_[p.unsafeGetTensorImpl()] = {buckets_.size(), m};
      elements.push_back(p.numel());
      b.offsets.push_back(offset);
      offset += p.numel();
    }
    b.shards = shard_bucket(elements, group_->size());
    const at::Tensor& first = params_[members.front()];
    b.sum = at::zeros({b.shards.counts[rank]}, first.options().dtype(gradient_type_of(first, floating_)).requires_grad(false));
    buckets_.push_back(std::move(b));
  }
}

int64_t GradientShards::shard_bytes() const {
  int64_t n = 0;
  for (const Bucket& b : buckets_) n += static_cast<int64_t>(b.sum.nbytes());
  return n;
}

void GradientShards::make_block(Bucket& b) const {
  const at::Tensor& first = params_[b.members.front()];
  b.block = at::zeros({b.shards.elements}, first.options().dtype(gradient_type_of(first, floating_)).requires_grad(false));
}

at::Tensor GradientShards::slot(const at::Tensor& param) const {
  auto it = where_.find(param.unsafeGetTensorImpl());
  if (it == where_.end()) return {};
  Bucket& b = buckets_[it->second.first];
  TORCH_CHECK(!b.reduced, "GradientShards: a gradient for a bucket already reduce-scattered in this backward");
  if (!b.block.defined()) make_block(b);
  const size_t m = it->second.second;
  const at::Tensor& p = params_[b.members[m]];
  // The parameter's own layout (channels-last weights too), as the gradient block's slots.
  return b.block.narrow(0, b.offsets[m], p.numel()).as_strided(p.sizes(), p.strides());
}

void GradientShards::backward_begins(const std::vector<const c10::TensorImpl*>& pending) {
  next_ = 0;
  for (Bucket& b : buckets_) {
    b.pending = 0;
    b.reduced = false;
  }
  for (const c10::TensorImpl* impl : pending) {
    auto it = where_.find(impl);
    if (it != where_.end()) ++buckets_[it->second.first].pending;
  }
  start_ready_buckets();  // parameters this backward does not reach are final already
}

void GradientShards::gradient_ready(const at::Tensor& param) {
  auto it = where_.find(param.unsafeGetTensorImpl());
  if (it == where_.end()) return;
  --buckets_[it->second.first].pending;
  start_ready_buckets();
}

void GradientShards::start_ready_buckets() {
  // In bucket order only: every rank then issues the same collectives in the same order.
  while (next_ < buckets_.size() && buckets_[next_].pending <= 0) start(buckets_[next_++]);
}

void GradientShards::backward_ended() {
  while (next_ < buckets_.size()) start(buckets_[next_++]);
  finish_in_flight();  // the next backward's buckets, and the step, need this one's sums
  ++backwards_;
}

void GradientShards::start(Bucket& b) {
  at::NoGradGuard no_grad;
  for (size_t k : b.members) {
    if (params_[k].grad().defined()) had_here_[k] = 1.0f;
  }
  if (!b.block.defined()) make_block(b);  // no gradient here this backward: zeros take part
  if (overlap_) {
    finish_in_flight();  // one under way at most: its block goes now, at this point of backward
    InFlight f;
    f.bucket = static_cast<size_t>(&b - buckets_.data());
    f.block = b.block;
    if (backwards_ > 0) f.part = at::empty_like(b.sum);
    f.ms = std::make_shared<double>(0);
    // The job's copies of the tensors only add references: the last one is f's, let go here.
    f.ticket = worker_->submit([block = f.block, into = f.part.defined() ? f.part : b.sum, counts = b.shards.counts,
                                ms = f.ms](Communicator& c) mutable {
      const auto start = std::chrono::steady_clock::now();
      c.reduce_scatter_sum(block, into, counts, "the gradients");
      *ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    });
    bytes_ += static_cast<int64_t>(b.block.nbytes());
    in_flight_ = std::move(f);
  } else {
    reduce_now(b);
  }
  // The block goes, and with it every gradient of the bucket: the next backward makes a new one.
  for (size_t k : b.members) params_[k].mutable_grad() = at::Tensor();
  b.block = at::Tensor();
  b.reduced = true;
  if (bucket_done_) bucket_done_(static_cast<size_t>(&b - buckets_.data()));
}

void GradientShards::finish_in_flight() {
  if (!in_flight_) return;
  InFlight f = std::move(*in_flight_);
  in_flight_.reset();
  wait_ms_ += worker_->wait_for(f.ticket);
  ms_ += *f.ms;
  if (f.part.defined()) buckets_[f.bucket].sum.add_(f.part);  // in micro-batch order, as without overlap
}

void GradientShards::reduce_now(Bucket& b) {
  const auto start = std::chrono::steady_clock::now();
  if (backwards_ == 0) {
    collective([&](Communicator& c) { c.reduce_scatter_sum(b.block, b.sum, b.shards.counts, "the gradients"); });
  } else {
    at::Tensor part = at::empty_like(b.sum);
    collective([&](Communicator& c) { c.reduce_scatter_sum(b.block, part, b.shards.counts, "the gradients"); });
    b.sum.add_(part);
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  ms_ += ms;
  wait_ms_ += ms;
  bytes_ += static_cast<int64_t>(b.block.nbytes());
}

void GradientShards::collective(const std::function<void(Communicator&)>& run) {
  if (worker_) {
    worker_->run(run);  // the tensors it uses outlive the wait
  } else {
    run(*group_);
  }
}

void GradientShards::finish_step() {
  at::NoGradGuard no_grad;
  stats_ = {};
  stats_.buckets = static_cast<int64_t>(buckets_.size()) * backwards_;
  stats_.started_in_backward = stats_.buckets;
  // Whether each parameter had a gradient on some rank, so that one no rank touched keeps none.
  at::Tensor had = at::tensor(had_here_);
  const auto start = std::chrono::steady_clock::now();
  finish_in_flight();
  collective([&](Communicator& c) { c.allreduce_sum(had, "the gradient flags"); });
  const double flags_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  ms_ += flags_ms;
  wait_ms_ += flags_ms;
  std::copy(had.data_ptr<float>(), had.data_ptr<float>() + had.numel(), had_anywhere_.begin());
  // As DataParallel's mean: the sum times 1/N, through the same scale_in_place (fp32 as ATen's
  // mul_; bf16 with 1/N kept in fp32, one rounding, at any N).
  const double inverse = 1.0 / static_cast<double>(group_->size());
  for (Bucket& b : buckets_) scale_in_place(b.sum, inverse);
  stats_.comm_ms = ms_;
  stats_.wait_ms = wait_ms_;
  stats_.overlap = ms_ > 0 ? std::clamp(1.0 - wait_ms_ / ms_, 0.0, 1.0) : 0.0;
  // On a GPU's stream the host times only the queueing: not measured (as DataParallel says).
  if (overlap_ && worker_ && !worker_->timed()) stats_.comm_ms = stats_.overlap = -1;
  stats_.comm_bytes = bytes_;
  std::fill(had_here_.begin(), had_here_.end(), 0.0f);
  backwards_ = 0;
  ms_ = 0;
  wait_ms_ = 0;
  bytes_ = 0;
}

}  // namespace ht

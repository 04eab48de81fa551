#include "memory/host_swap.h"
#include "base/clock.h"

#include "runtime/interpreter.h"

#include "alloc/cpu_device_allocator.h"
#include "alloc/memory_timeline.h"
#include "runtime/op.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace ht {
namespace {

// A float32 storage's bytes as one flat float tensor (what crosses as bf16 under compression).
at::Tensor as_floats(const at::Tensor& bytes_or_value, int64_t bytes) {
  return at::empty({0}, at::TensorOptions().dtype(at::kFloat).device(bytes_or_value.device()))
      .set_(bytes_or_value.storage(), 0, {bytes / 4}, {1});
}

int64_t host_bytes(const HostCopy& h) { return static_cast<int64_t>(h.host.nbytes()); }

// Made by a kernel that does arithmetic, not moves bytes: a contraction, a convolution or
// attention (dear to recompute, so worth the link's time).
bool made_by_heavy_op(const TensorInfo& t) {
  return t.producer && t.producer->op->traits().work != Work::kMemory;
}

}  // namespace

HostSwap::HostSwap(SwapOptions options) : options_(std::move(options)) {
  TORCH_CHECK(options_.link != nullptr, "HostSwap: no host link");
}

HostSwap::~HostSwap() = default;

void HostSwap::step_begins() {
  step_start_ = Clock::now();
  in_backward_ = false;
}

void HostSwap::backward_begins() {
  if (in_backward_ || step_start_ == Clock::time_point{}) return;
  in_backward_ = true;
  last_forward_ms_ = ms_since(step_start_);
}

bool HostSwap::hidden_under_forward(int64_t bytes) const {
  if (in_backward_) return false;  // backward reads what it makes at once
  const double backlog = options_.link->backlog_ms(CopyDirection::kToHost);
  const double copy = options_.link->transfer_ms(bytes);
  // Before the first whole step, only an idle link is sure to keep up.
  if (last_forward_ms_ < 0 || step_start_ == Clock::time_point{}) return backlog == 0;
  return backlog + copy <= last_forward_ms_ - ms_since(step_start_);
}

bool HostSwap::crosses_narrow(const at::Tensor& value) const {
  return options_.bf16_on_link && value.scalar_type() == at::kFloat && value.storage().nbytes() % 4 == 0;
}

void HostSwap::account_host(int64_t delta) {
  stats_.host_bytes += delta;
  stats_.peak_host_bytes = std::max(stats_.peak_host_bytes, stats_.host_bytes);
}

void HostSwap::consider(TensorInfo& t, bool read_by_heavy_op) {
  if (options_.rule == SwapRule::kPlanned || t.host != nullptr || !t.resident()) return;
  // A root's nbytes is its storage's: what a copy would move (start_out checks the rest).
  if (options_.rule == SwapRule::kConvAndMatmul ? !(read_by_heavy_op || made_by_heavy_op(t))
                                                : !hidden_under_forward(t.nbytes / (crosses_narrow(t.value) ? 2 : 1))) {
    return;
  }
  start_out(t);
}

bool HostSwap::start_out(TensorInfo& t) {
  if (t.host != nullptr || t.is_leaf || t.is_view() || !t.resident() || !t.value.has_storage()) return false;
  if (!t.producer || !t.owner->recomputes(*t.producer)) return false;
  const auto bytes = static_cast<int64_t>(t.value.storage().nbytes());
  if (bytes < options_.min_bytes) return false;
  const bool narrow = crosses_narrow(t.value);
  const int64_t kept = narrow ? bytes / 2 : bytes;
  if (stats_.host_bytes + kept > options_.host_budget_bytes) {
    ++stats_.refused_host_full;
    return false;
  }
  auto copy = std::make_unique<HostCopy>();
  {
    HostAllocationScope host_memory;  // outside the arena
    copy->host = narrow ? options_.link->host_empty(bytes / 4, at::kBFloat16) : options_.link->host_empty(bytes, at::kByte);
  }
  copy->device_bytes = bytes;
  copy->strides.assign(t.value.strides().begin(), t.value.strides().end());
  copy->storage_offset = t.value.storage_offset();
  copy->out = narrow ? options_.link->convert(CopyDirection::kToHost, as_floats(t.value, bytes), copy->host)
                     : options_.link->copy(CopyDirection::kToHost, t.value, copy->host);
  t.host = std::move(copy);
  account_host(kept);
  ++stats_.copies_out;
  stats_.bytes_out += kept;
  return true;
}

bool HostSwap::copied_out(TensorInfo& t, bool wait) {
  if (t.host == nullptr || !t.host->out) return false;
  if (!t.host->out->done() && wait) {
    const double waited = t.host->out->finish();
    stats_.wait_ms += waited;
    if (timeline_ != nullptr && waited > 0) timeline_->copy_wait(t.id, waited);
  }
  return t.host->out->done();
}

bool HostSwap::copy_before_drop(TensorInfo& victim, double recompute_ms) {
  if (options_.rule != SwapRule::kHidden || victim.host != nullptr || !victim.value.has_storage()) return false;
  const auto bytes = static_cast<int64_t>(victim.value.storage().nbytes()) / (crosses_narrow(victim.value) ? 2 : 1);
  const double copy_ms = options_.link->backlog_ms(CopyDirection::kToHost) + options_.link->transfer_ms(bytes);
  if (copy_ms >= recompute_ms || !start_out(victim)) return false;
  const double waited = victim.host->out->finish();
  stats_.wait_ms += waited;
  if (timeline_ != nullptr && waited > 0) timeline_->copy_wait(victim.id, waited);
  ++stats_.copied_before_drop;
  return true;
}

TensorInfo* HostSwap::pick_victim(const std::vector<TensorInfo*>& candidates) const {
  TensorInfo* best = nullptr;
  for (TensorInfo* t : candidates) {
    if (t->host == nullptr || !t->evictable() || !t->on_host()) continue;
    if (best == nullptr || t->nbytes > best->nbytes || (t->nbytes == best->nbytes && t->id < best->id)) best = t;
  }
  return best;
}

TensorInfo* HostSwap::later_victim(const std::vector<TensorInfo*>& candidates, const TensorInfo& sooner) const {
  TensorInfo* best = nullptr;
  for (TensorInfo* t : candidates) {
    if (t == &sooner || t->id >= sooner.id || t->host == nullptr || t->host->in || !t->evictable() || !t->on_host()) continue;
    if (best == nullptr || t->id < best->id) best = t;
  }
  return best;
}

bool HostSwap::wait_for_copy_out(const std::vector<TensorInfo*>& candidates) {
  TensorInfo* oldest = nullptr;
  for (TensorInfo* t : candidates) {
    if (t->pin_count == 0 && t->copying_to_host() && (oldest == nullptr || t->id < oldest->id)) oldest = t;
  }
  if (oldest == nullptr) return false;
  const double waited = oldest->host->out->finish();  // on_host() next: done, not only ordered
  stats_.wait_ms += waited;
  if (timeline_ != nullptr && waited > 0) timeline_->copy_wait(oldest->id, waited);
  return true;
}

void HostSwap::start_in(TensorInfo& t, at::Tensor device_bytes, bool prefetched) {
  HostCopy& h = *t.host;
  h.incoming = std::move(device_bytes);
  h.in = h.host.scalar_type() == at::kByte
             ? options_.link->copy(CopyDirection::kToDevice, h.host, h.incoming)
             : options_.link->convert(CopyDirection::kToDevice, h.host, as_floats(h.incoming, h.device_bytes));
  h.prefetched = prefetched;
  ++stats_.copies_in;
  stats_.bytes_in += host_bytes(h);
  if (prefetched) {
    ++stats_.prefetched_in;
    prefetching_.push_back(&t);
  }
}

void HostSwap::forget_prefetch(TensorInfo& t) {
  auto it = std::find(prefetching_.begin(), prefetching_.end(), &t);
  if (it != prefetching_.end()) prefetching_.erase(it);
}

bool HostSwap::cancel_prefetch() {
  if (prefetching_.empty()) return false;
  TensorInfo& t = *prefetching_.back();
  prefetching_.pop_back();
  HostCopy& h = *t.host;
  h.in->wait();  // the copy writes the bytes: they go back only once it is done
  ++stats_.prefetches_cancelled;  // its bytes crossed: they stay counted
  h.in.reset();
  h.incoming = at::Tensor();
  h.prefetched = false;
  return true;
}

at::Tensor HostSwap::bring_back(TensorInfo& t) {
  TORCH_INTERNAL_ASSERT(t.host != nullptr && !t.resident(), "bring_back: tensor ", t.id, " has no host copy");
  HostCopy& h = *t.host;
  if (!h.out->done()) stats_.wait_ms += h.out->wait();  // dropped only once copied: defensive
  if (!h.in) {
    start_in(t, at::empty({h.device_bytes}, at::TensorOptions().dtype(at::kByte).device(t.device)), /*prefetched=*/false);
  }
  const double waited = h.in->wait();
  stats_.wait_ms += waited;
  if (h.prefetched && waited == 0) stats_.bytes_in_hidden += host_bytes(h);
  if (timeline_ != nullptr) {
    timeline_->copy(/*to_host=*/false, t.id, host_bytes(h), h.in->started(), h.in->finished());
    if (waited > 0) timeline_->copy_wait(t.id, waited);
  }
  if (h.prefetched) forget_prefetch(t);
  at::Tensor bytes = std::move(h.incoming);
  h.incoming = at::Tensor();
  h.in.reset();
  h.prefetched = false;
  at::Tensor value = at::empty({0}, at::TensorOptions().dtype(t.dtype).device(t.device));
  value.set_(bytes.storage(), h.storage_offset, t.sizes, h.strides);
  return value;
}

void HostSwap::dropped(TensorInfo& t) {
  ++stats_.drops;
  if (timeline_ != nullptr && t.host != nullptr && t.host->out) {
    timeline_->copy(/*to_host=*/true, t.id, host_bytes(*t.host), t.host->out->started(), t.host->out->finished());
  }
}

void HostSwap::release(TensorInfo& t) {
  if (t.parked_grad != nullptr) {
    account_host(-host_bytes(t.parked_grad->copy));
    t.parked_grad.reset();  // its copy out was waited for when it was parked
  }
  if (t.host == nullptr) return;
  // Wait for copies in flight, so that both ends are freed here, on this thread.
  if (t.host->out) t.host->out->wait();
  if (t.host->in) t.host->in->wait();
  if (t.host->prefetched) forget_prefetch(t);
  account_host(-host_bytes(*t.host));
  t.host.reset();
}

bool HostSwap::park_gradient(TensorInfo& t) {
  const at::Tensor& g = t.grad;
  if (!g.defined() || t.parked_grad != nullptr || !g.has_storage() || g.sizes() != at::IntArrayRef(t.sizes)) return false;
  // Another holder (add's backward hands one tensor to both inputs) would keep the bytes alive.
  if (g.use_count() != 1 || g.storage().use_count() != 1) return false;
  const auto bytes = static_cast<int64_t>(g.storage().nbytes());
  if (bytes < options_.min_bytes) return false;
  if (stats_.host_bytes + bytes > options_.host_budget_bytes) {
    ++stats_.refused_host_full;
    return false;
  }
  auto parked = std::make_unique<ParkedGradient>();
  {
    HostAllocationScope host_memory;  // outside the arena
    parked->copy.host = options_.link->host_empty(bytes, at::kByte);
  }
  parked->copy.device_bytes = bytes;
  parked->copy.strides.assign(g.strides().begin(), g.strides().end());
  parked->copy.storage_offset = g.storage_offset();
  parked->dtype = g.scalar_type();
  parked->copy.out = options_.link->copy(CopyDirection::kToHost, g, parked->copy.host);
  const double waited = parked->copy.out->wait();  // its bytes are needed now
  stats_.wait_ms += waited;
  if (timeline_ != nullptr) {
    timeline_->copy(/*to_host=*/true, t.id, bytes, parked->copy.out->started(), parked->copy.out->finished());
    if (waited > 0) timeline_->copy_wait(t.id, waited);
  }
  t.parked_grad = std::move(parked);
  t.grad = at::Tensor();  // the job has finished with it: the device bytes are free
  account_host(bytes);
  ++stats_.gradients_parked;
  ++stats_.copies_out;
  stats_.bytes_out += bytes;
  return true;
}

at::Tensor HostSwap::unpark_gradient(TensorInfo& t) {
  TORCH_INTERNAL_ASSERT(t.parked_grad != nullptr, "unpark_gradient: tensor ", t.id, " has no parked gradient");
  HostCopy& h = t.parked_grad->copy;
  at::Tensor bytes = at::empty({h.device_bytes}, at::TensorOptions().dtype(at::kByte).device(t.device));
  std::shared_ptr<CopyJob> in = options_.link->copy(CopyDirection::kToDevice, h.host, bytes);
  const double waited = in->wait();
  stats_.wait_ms += waited;
  ++stats_.copies_in;
  stats_.bytes_in += h.device_bytes;
  if (timeline_ != nullptr) {
    timeline_->copy(/*to_host=*/false, t.id, h.device_bytes, in->started(), in->finished());
    if (waited > 0) timeline_->copy_wait(t.id, waited);
  }
  at::Tensor grad = at::empty({0}, at::TensorOptions().dtype(t.parked_grad->dtype).device(bytes.device()));
  grad.set_(bytes.storage(), h.storage_offset, t.sizes, h.strides);
  account_host(-host_bytes(h));
  t.parked_grad.reset();
  return grad;
}

}  // namespace ht

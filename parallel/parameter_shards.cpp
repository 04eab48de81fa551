#include "parallel/parameter_shards.h"
#include "base/clock.h"

#include "alloc/cpu_device_allocator.h"
#include "runtime/kernel_cost.h"
#include "runtime/memory_hooks.h"

#include <ATen/ATen.h>

#include <chrono>

namespace ht {
namespace {

c10::StorageImpl& storage_of(const at::Tensor& t) { return *t.storage().unsafeGetStorageImpl(); }

}  // namespace

ParameterShards::ParameterShards(std::shared_ptr<Communicator> group, std::vector<at::Tensor> params,
                                 const std::vector<std::vector<size_t>>& buckets, const at::Device& device)
    : group_(std::move(group)), params_(std::move(params)) {
  at::NoGradGuard no_grad;
  const auto rank = static_cast<size_t>(group_->rank());
  for (const std::vector<size_t>& members : buckets) {
    Bucket b;
    b.members = members;
    const at::TensorOptions options = params_[members.front()].options().requires_grad(false).device(device);
    std::vector<int64_t> elements;
    int64_t n = 0;
    for (size_t k : members) {
      const at::Tensor& p = params_[k];
      TORCH_CHECK(p.is_non_overlapping_and_dense(), "ParameterShards: a parameter with gaps in its layout");
      TORCH_CHECK(p.scalar_type() == options.dtype(), "ParameterShards: a bucket of two dtypes");
      bucket_of_[p.unsafeGetTensorImpl()] = buckets_.size();
      elements.push_back(p.numel());
      n += p.numel();
    }
    b.shards = shard_bucket(elements, group_->size());
    {
      // The bucket's own storage, in host memory while it is filled: the whole model never needs
      // device memory at once.
      HostAllocationScope host;
      b.whole = at::empty({n}, options);
    }
    int64_t at = 0;
    for (size_t k : members) {
      at::Tensor& p = params_[k];
      at::Tensor slot = b.whole.as_strided(p.sizes(), p.strides(), at);
      slot.copy_(p);
      p.set_data(slot);  // the same at::Tensor (its identity), now a view of the bucket's storage
      at += p.numel();
    }
    shards_.push_back(b.whole.narrow(0, b.shards.begins[rank], b.shards.counts[rank]).clone());
    b.gathered = true;
    buckets_.push_back(std::move(b));
    release(buckets_.back());
  }
}

ParameterShards::~ParameterShards() = default;

int64_t ParameterShards::shard_bytes() const {
  int64_t n = 0;
  for (const at::Tensor& s : shards_) n += static_cast<int64_t>(s.nbytes());
  return n;
}

int64_t ParameterShards::largest_bucket_bytes() const {
  int64_t n = 0;
  for (const Bucket& b : buckets_) n = std::max(n, b.shards.elements * static_cast<int64_t>(b.whole.element_size()));
  return n;
}

double modeled_gather_ms(int64_t bytes) { return static_cast<double>(bytes) / kModeledBytesPerMs; }

void ParameterShards::before_read(const at::Tensor& weight, MemoryHooks& memory, uint64_t now) {
  auto it = bucket_of_.find(weight.unsafeGetTensorImpl());
  if (it == bucket_of_.end()) return;  // not sharded (no gradient): always resident
  Bucket& b = buckets_[it->second];
  if (!frames_.empty()) {  // held before gathering: making room for it must not drop it
    ++b.holds;
    frames_.back().push_back(it->second);
  }
  b.last_access = now;
  if (!b.gathered) {
    gather(b, &memory, /*now=*/true);
  } else {
    finish(b);
  }
}

void ParameterShards::end_reads() {
  TORCH_INTERNAL_ASSERT(!frames_.empty(), "ParameterShards: end_reads without begin_reads");
  for (size_t b : frames_.back()) --buckets_[b].holds;
  frames_.pop_back();
}

std::vector<DroppableParameters> ParameterShards::droppable() const {
  std::vector<DroppableParameters> out;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    const Bucket& b = buckets_[i];
    if (!b.gathered || b.holds > 0 || b.ticket != 0) continue;
    const int64_t bytes = b.shards.elements * static_cast<int64_t>(b.whole.element_size());
    out.push_back(DroppableParameters{i, bytes, modeled_gather_ms(bytes), b.last_access});
  }
  return out;
}

void ParameterShards::drop(size_t id) {
  Bucket& b = buckets_.at(id);
  TORCH_CHECK(b.holds == 0, "ParameterShards: dropping a bucket a kernel reads");
  release(b);
  ++stats_.drops;
}

void ParameterShards::gather(Bucket& b, MemoryHooks* memory, bool now) {
  at::NoGradGuard no_grad;
  const auto start = std::chrono::steady_clock::now();
  const size_t i = static_cast<size_t>(&b - buckets_.data());
  const int64_t bytes = b.shards.elements * static_cast<int64_t>(b.whole.element_size());
  // Its memory first (the memory manager may evict to make room), then the collective, which no
  // retry may repeat.
  auto allocate = [&] { return at::empty({b.shards.elements}, b.whole.options()); };
  at::Tensor fresh = memory != nullptr ? run_with_room(*memory, allocate) : allocate();
  c10::StorageImpl& storage = storage_of(b.whole);
  storage.set_data_ptr_noswap(storage_of(fresh).set_data_ptr(at::DataPtr(nullptr, fresh.device())));
  storage.set_nbytes(static_cast<size_t>(bytes));
  b.gathered = true;
  ++stats_.gathers;
  stats_.bytes += bytes - static_cast<int64_t>(shards_[i].nbytes());
  if (!worker_) {
    group_->all_gather(shards_[i], b.whole, b.shards.counts, "the parameters");
    const double ms = ms_since(start);
    stats_.ms += ms;
    stats_.waited_ms += ms;
    return;
  }
  // On the worker: this object keeps the shard, the bucket's storage and its counts alive and
  // untouched until finish() (the worker's copies of the tensors are never the last).
  b.ticket = worker_->submit([shard = shards_[i], whole = b.whole, counts = b.shards.counts, times = worker_ms_,
                              i](Communicator& group) mutable {
    const auto begin = std::chrono::steady_clock::now();
    group.all_gather(shard, whole, counts, "the parameters");
    (*times)[i] = ms_since(begin);
  });
  stats_.ms += ms_since(start);  // the allocation
  if (now) finish(b);
}

void ParameterShards::finish(Bucket& b) {
  if (b.ticket == 0) return;
  const uint64_t ticket = b.ticket;
  b.ticket = 0;
  stats_.waited_ms += worker_->wait_for(ticket);
  stats_.ms += (*worker_ms_)[static_cast<size_t>(&b - buckets_.data())];
}

void ParameterShards::release(Bucket& b) {
  if (!b.gathered) return;
  finish(b);  // the worker may be writing into it
  TORCH_INTERNAL_ASSERT(b.holds == 0, "ParameterShards: freeing a bucket a kernel reads");
  c10::StorageImpl& storage = storage_of(b.whole);
  storage.set_data_ptr_noswap(at::DataPtr(nullptr, b.whole.device()));
  storage.set_nbytes(0);
  b.gathered = false;
}

void ParameterShards::set_block_uses(const std::vector<std::vector<at::Tensor>>& block_params) {
  uses_.assign(block_params.size(), std::vector<bool>(buckets_.size(), false));
  for (size_t blk = 0; blk < block_params.size(); ++blk) {
    for (const at::Tensor& p : block_params[blk]) {
      auto it = bucket_of_.find(p.unsafeGetTensorImpl());
      if (it != bucket_of_.end()) uses_[blk][it->second] = true;
    }
  }
}

void ParameterShards::set_prefetch(std::shared_ptr<CollectiveWorker> worker, int depth) {
  TORCH_CHECK(!managed_, "ParameterShards: prefetching under a managed budget");
  worker_ = depth > 0 ? std::move(worker) : nullptr;
  depth_ = depth;
  worker_ms_ = std::make_shared<std::vector<double>>(buckets_.size(), 0.0);
}

void ParameterShards::block_begins(int block) {
  // After the last block: the last blocks' buckets are what backward reads first; they stay.
  // Managed: the memory manager drops what it needs the room of.
  if (managed_ || block < 0 || static_cast<size_t>(block) >= uses_.size()) return;
  // This block and, prefetching, the next `depth` blocks that read any bucket.
  std::vector<size_t> blocks{static_cast<size_t>(block)};
  for (size_t j = blocks.front() + 1; worker_ && j < uses_.size() && blocks.size() <= static_cast<size_t>(depth_); ++j) {
    if (std::find(uses_[j].begin(), uses_[j].end(), true) != uses_[j].end()) blocks.push_back(j);
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const bool kept = std::any_of(blocks.begin(), blocks.end(), [&](size_t j) { return uses_[j][b]; });
    if (!kept) release(buckets_[b]);
  }
  if (worker_) prefetch_blocks(blocks, /*backward=*/false);
}

void ParameterShards::prefetch_blocks(const std::vector<size_t>& blocks, bool backward) {
  for (size_t j : blocks) {
    for (size_t b = 0; b < buckets_.size(); ++b) {
      if (uses_[j][b] && (!backward || read_back_[b]) && !buckets_[b].gathered) gather(buckets_[b], nullptr, false);
    }
  }
}

void ParameterShards::backward_will_read(const std::vector<at::Tensor>& weights) {
  backward_block_ = uses_.size();
  read_back_.assign(buckets_.size(), false);
  for (const at::Tensor& w : weights) {
    auto it = bucket_of_.find(w.unsafeGetTensorImpl());
    if (it != bucket_of_.end()) read_back_[it->second] = true;
  }
  // What forward left gathered and backward will not read goes now (under autocast the last
  // blocks' cast weights: backward reads their copies). Managed: the memory manager decides.
  if (managed_) return;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (!read_back_[b] && buckets_[b].holds == 0) release(buckets_[b]);
  }
}

void ParameterShards::backward_enters(int block) {
  if (worker_ && block >= 0 && static_cast<size_t>(block) < backward_block_) {
    reach(static_cast<size_t>(block));
  }
}

void ParameterShards::reach(size_t block) {
  backward_block_ = block;
  // The `depth` blocks before it that the last backward read weights of.
  std::vector<size_t> ahead;
  for (size_t j = block; j-- > 0 && ahead.size() < static_cast<size_t>(depth_);) {
    for (size_t b = 0; b < buckets_.size(); ++b) {
      if (uses_[j][b] && read_back_[b]) {
        ahead.push_back(j);
        break;
      }
    }
  }
  prefetch_blocks(ahead, /*backward=*/true);
}

void ParameterShards::bucket_done(size_t b) { release(buckets_.at(b)); }

void ParameterShards::release_all() {
  for (Bucket& b : buckets_) release(b);
}

void ParameterShards::gather_all(MemoryHooks& memory) {
  for (Bucket& b : buckets_) {
    if (!b.gathered) gather(b, &memory, /*now=*/true);
  }
}

void ParameterShards::take_from_whole() {
  at::NoGradGuard no_grad;
  const auto rank = static_cast<size_t>(group_->rank());
  for (size_t i = 0; i < buckets_.size(); ++i) {
    const Bucket& b = buckets_[i];
    TORCH_CHECK(b.gathered, "ParameterShards::take_from_whole: bucket ", i, " is not gathered");
    shards_[i].copy_(b.whole.narrow(0, b.shards.begins[rank], b.shards.counts[rank]));
  }
}

ParameterGatherStats ParameterShards::take_stats() {
  const ParameterGatherStats s = stats_;
  stats_ = {};
  return s;
}

}  // namespace ht

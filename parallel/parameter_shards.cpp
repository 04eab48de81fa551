#include "parallel/parameter_shards.h"
#include "base/clock.h"

#include "alloc/cpu_device_allocator.h"
#include "runtime/kernel_cost.h"
#include "runtime/memory_hooks.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>

namespace ht {
namespace {

c10::StorageImpl& storage_of(const at::Tensor& t) { return *t.storage().unsafeGetStorageImpl(); }

void free_storage(const at::Tensor& t) {
  c10::StorageImpl& storage = storage_of(t);
  storage.set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  storage.set_nbytes(0);
}

// A flat tensor of `n` elements in host memory, while views of it are made (as_strided checks
// them against its storage); then free_storage leaves it gathered nowhere.
at::Tensor for_views(int64_t n, const at::TensorOptions& options) {
  HostAllocationScope host;
  return at::empty({n}, options);
}

// Each rank's part of the span's elements [from, from + n).
std::vector<int64_t> counts_within(const BucketShards& shards, int64_t from, int64_t n) {
  std::vector<int64_t> counts(shards.counts.size());
  for (size_t r = 0; r < counts.size(); ++r) {
    const int64_t lo = std::max(from, shards.begins[r]);
    const int64_t hi = std::min(from + n, shards.begins[r] + shards.counts[r]);
    counts[r] = std::max<int64_t>(0, hi - lo);
  }
  return counts;
}

const char* what_of(uint8_t kind) {
  static const char* names[] = {"the parameters", "the 16-bit weights", "a weight read in fp32"};
  return names[kind];
}

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
      unit_of_[p.unsafeGetTensorImpl()] = units_.size();
      member_of_[p.unsafeGetTensorImpl()] = Member{buckets_.size(), b.at.size()};
      b.at.push_back(n);
      elements.push_back(p.numel());
      n += p.numel();
    }
    b.shards = shard_bucket(elements, group_->size());
    Unit whole;
    whole.bucket = buckets_.size();
    whole.counts = b.shards.counts;
    {
      // The bucket's own storage, in host memory while it is filled: the whole model never needs
      // device memory at once.
      HostAllocationScope host;
      whole.whole = at::empty({n}, options);
    }
    for (size_t j = 0; j < members.size(); ++j) {
      at::Tensor& p = params_[members[j]];
      at::Tensor slot = whole.whole.as_strided(p.sizes(), p.strides(), b.at[j]);
      slot.copy_(p);
      p.set_data(slot);  // the same at::Tensor (its identity), now a view of the bucket's storage
    }
    shards_.push_back(whole.whole.narrow(0, b.shards.begins[rank], b.shards.counts[rank]).clone());
    whole.gathered = true;
    b.whole = add_unit(std::move(whole));
    buckets_.push_back(std::move(b));
    release(units_[buckets_.back().whole]);
  }
}

ParameterShards::~ParameterShards() = default;

size_t ParameterShards::add_unit(Unit u) {
  units_.push_back(std::move(u));
  return units_.size() - 1;
}

int64_t ParameterShards::shard_bytes() const {
  int64_t n = 0;
  for (const at::Tensor& s : shards_) n += static_cast<int64_t>(s.nbytes());
  return n;
}

int64_t ParameterShards::largest_bucket_bytes() const {
  int64_t n = 0;
  for (const Bucket& b : buckets_) n = std::max(n, units_[b.whole].bytes());
  return n;
}

double modeled_gather_ms(int64_t bytes) { return static_cast<double>(bytes) / kModeledBytesPerMs; }

void ParameterShards::keep_copies(at::ScalarType dtype) {
  TORCH_CHECK(!copies_dtype_, "ParameterShards::keep_copies: called twice");
  copies_dtype_ = dtype;
  const auto rank = static_cast<size_t>(group_->rank());
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& b = buckets_[i];
    const Unit& whole = units_[b.whole];
    Unit copies;
    copies.kind = Kind::kCopies;
    copies.bucket = i;
    copies.counts = b.shards.counts;
    copies.whole = for_views(b.shards.elements, whole.whole.options().dtype(dtype));
    const size_t id = add_unit(std::move(copies));
    b.copies = id;
    for (size_t j = 0; j < b.members.size(); ++j) {
      const at::Tensor& p = params_[b.members[j]];
      at::Tensor view = units_[id].whole.as_strided(p.sizes(), p.strides(), b.at[j]);
      unit_of_[view.unsafeGetTensorImpl()] = id;
      copy_views_[p.unsafeGetTensorImpl()] = std::move(view);
    }
    free_storage(units_[id].whole);
    // Resident copies are gathered once a step: each rank rounds its shard into its own range of
    // the gathered bucket and gathers in place, with no 16-bit shard kept beside it.
    if (!resident_) b.shard16 = at::empty({b.shards.counts[rank]}, shards_[i].options().dtype(dtype));
  }
}

at::Tensor ParameterShards::copy_of(const at::Tensor& weight, at::ScalarType dtype) {
  if (!copies_dtype_ || dtype != *copies_dtype_) return {};
  auto it = copy_views_.find(weight.unsafeGetTensorImpl());
  return it == copy_views_.end() ? at::Tensor() : it->second;
}

void ParameterShards::weights_changed() {
  ++epoch_;
  // A step has read what it reads (not a checkpoint read before any step).
  if (std::any_of(buckets_.begin(), buckets_.end(), [](const Bucket& b) { return b.copies_read; })) reads_known_ = true;
  if (resident_) {  // what stayed gathered is the last step's: gathered again where next read
    held_copies_bytes_ = 0;
    for (Unit& u : units_) {
      if (u.kind == Kind::kCopies && u.gathered) held_copies_bytes_ += u.bytes();
      release(u);
    }
  }
  made_last_step_ = made_;
  made_ = 0;
}

int64_t ParameterShards::bytes() const {
  if (resident_) return held_copies_bytes_;
  int64_t n = 0;
  for (const Bucket& b : buckets_) {
    if (b.shard16.defined()) {
      n += static_cast<int64_t>(b.shard16.nbytes());
    }
  }
  return n;
}

size_t ParameterShards::single_of(const at::Tensor& weight, size_t whole_unit) {
  const Member m = member_of_.at(weight.unsafeGetTensorImpl());
  Bucket& b = buckets_[m.bucket];
  const Unit& whole = units_[whole_unit];
  at::Tensor p = params_[b.members[m.position]];
  Unit single;
  single.kind = Kind::kMember;
  single.bucket = m.bucket;
  single.from = b.at[m.position];
  single.counts = counts_within(b.shards, single.from, p.numel());
  single.whole = for_views(p.numel(), whole.whole.options());
  {
    at::NoGradGuard no_grad;
    // The same at::Tensor, now a view of a storage of its own (nothing holds a view of the old
    // one: a weight's first read in fp32 is this one).
    p.set_data(single.whole.as_strided(p.sizes(), p.strides(), 0));
  }
  free_storage(single.whole);
  const size_t id = add_unit(std::move(single));
  b.singles.push_back(id);
  unit_of_[p.unsafeGetTensorImpl()] = id;
  if (read_back_.size() < units_.size()) read_back_.resize(units_.size(), false);
  return id;
}

void ParameterShards::before_read(const at::Tensor& weight, MemoryHooks& memory, uint64_t now) {
  auto it = unit_of_.find(weight.unsafeGetTensorImpl());
  if (it == unit_of_.end()) return;  // not sharded (no gradient): always resident
  size_t id = it->second;
  // Under copies a weight read in fp32 (the copies serve every 16-bit read) is gathered alone.
  if (copies_dtype_ && units_[id].kind == Kind::kWhole) id = single_of(weight, id);
  Unit& u = units_[id];
  if (u.kind == Kind::kCopies) buckets_[u.bucket].copies_read = true;
  if (!frames_.empty()) {  // held before gathering: making room for it must not drop it
    ++u.holds;
    frames_.back().push_back(id);
  }
  u.last_access = now;
  if (!u.gathered) {
    gather(u, &memory, /*now=*/true);
  } else {
    finish(u);
  }
}

void ParameterShards::end_reads() {
  TORCH_INTERNAL_ASSERT(!frames_.empty(), "ParameterShards: end_reads without begin_reads");
  for (size_t u : frames_.back()) --units_[u].holds;
  frames_.pop_back();
}

std::vector<DroppableParameters> ParameterShards::droppable() const {
  std::vector<DroppableParameters> out;
  for (size_t i = 0; i < units_.size(); ++i) {
    const Unit& u = units_[i];
    if (!u.gathered || u.holds > 0 || u.ticket != 0) continue;
    out.push_back(DroppableParameters{i, u.bytes(), modeled_gather_ms(u.bytes()), u.last_access});
  }
  return out;
}

void ParameterShards::drop(size_t id) {
  Unit& u = units_.at(id);
  TORCH_CHECK(u.holds == 0, "ParameterShards: dropping a bucket a kernel reads");
  release(u);
  ++stats_.drops;
}

at::Tensor ParameterShards::contribution(Unit& u) {
  Bucket& b = buckets_[u.bucket];
  const auto rank = static_cast<size_t>(group_->rank());
  const at::Tensor& shard = shards_[u.bucket];
  switch (u.kind) {
    case Kind::kWhole: return shard;
    case Kind::kCopies:
      if (b.shard16_epoch != epoch_) {
        at::NoGradGuard no_grad;
        b.shard16.copy_(shard);  // rounded to nearest even, as one rank's copy of the whole weight
        b.shard16_epoch = epoch_;
        ++made_;
      }
      return b.shard16;
    case Kind::kMember: {
      const int64_t from = std::max(u.from, b.shards.begins[rank]);
      return shard.narrow(0, std::min(from - b.shards.begins[rank], shard.numel()), u.counts[rank]);
    }
  }
  return shard;
}

void ParameterShards::gather(Unit& u, MemoryHooks* memory, bool now) {
  at::NoGradGuard no_grad;
  const auto start = std::chrono::steady_clock::now();
  const int64_t bytes = u.bytes();
  const bool in_place = resident_ && u.kind == Kind::kCopies;  // rounded into its own range below
  at::Tensor send = in_place ? at::Tensor() : contribution(u);
  // Its memory first (the memory manager may evict to make room), then the collective, which no
  // retry may repeat.
  auto allocate = [&] { return at::empty({u.whole.numel()}, u.whole.options()); };
  at::Tensor fresh = memory != nullptr ? run_with_room(*memory, allocate) : allocate();
  c10::StorageImpl& storage = storage_of(u.whole);
  storage.set_data_ptr_noswap(storage_of(fresh).set_data_ptr(at::DataPtr(nullptr, fresh.device())));
  storage.set_nbytes(static_cast<size_t>(bytes));
  if (in_place) {
    const auto rank = static_cast<size_t>(group_->rank());
    const BucketShards& shards = buckets_[u.bucket].shards;
    send = u.whole.narrow(0, shards.begins[rank], shards.counts[rank]);
    send.copy_(shards_[u.bucket]);  // rounded to nearest even, as one rank's copy of the whole weight
    ++made_;
  }
  u.gathered = true;
  ++stats_.gathers;
  stats_.bytes += bytes - static_cast<int64_t>(send.nbytes());
  const char* what = what_of(static_cast<uint8_t>(u.kind));
  if (!worker_) {
    group_->all_gather(send, u.whole, u.counts, what);
    const double ms = ms_since(start);
    stats_.ms += ms;
    stats_.waited_ms += ms;
    return;
  }
  // On the worker: this object keeps what it sends, the unit's storage and its counts alive and
  // untouched until finish() (the worker's copies of the tensors are never the last).
  u.ticket = worker_->submit([send, whole = u.whole, counts = u.counts, times = u.worker_ms,
                              what](Communicator& group) mutable {
    const auto begin = std::chrono::steady_clock::now();
    group.all_gather(send, whole, counts, what);
    *times = ms_since(begin);
  });
  stats_.ms += ms_since(start);  // the allocation
  if (now) finish(u);
}

void ParameterShards::finish(Unit& u) {
  if (u.ticket == 0) return;
  const uint64_t ticket = u.ticket;
  u.ticket = 0;
  stats_.waited_ms += worker_->wait_for(ticket);
  stats_.ms += *u.worker_ms;
}

void ParameterShards::release(Unit& u) {
  if (!u.gathered) return;
  finish(u);  // the worker may be writing into it
  TORCH_INTERNAL_ASSERT(u.holds == 0, "ParameterShards: freeing a bucket a kernel reads");
  free_storage(u.whole);
  u.gathered = false;
}

void ParameterShards::release_bucket(size_t i) {
  const Bucket& b = buckets_[i];
  release(units_[b.whole]);
  if (b.copies) release_unless_staying(units_[*b.copies]);
  for (size_t s : b.singles) release_unless_staying(units_[s]);
}

std::vector<size_t> ParameterShards::reading_units(size_t i) const {
  const Bucket& b = buckets_[i];
  if (!b.copies) return {b.whole};
  // Its copies unless a whole step read none of them (a bucket of weights read in fp32 only: an
  // embedding's table).
  std::vector<size_t> out;
  if (!reads_known_ || b.copies_read) out.push_back(*b.copies);
  out.insert(out.end(), b.singles.begin(), b.singles.end());
  return out;
}

void ParameterShards::bucket_done(size_t b) { release_bucket(b); }

void ParameterShards::release_all() {
  for (Unit& u : units_) release_unless_staying(u);
}

void ParameterShards::gather_all(MemoryHooks& memory) {
  for (Bucket& b : buckets_) {
    if (!units_[b.whole].gathered) gather(units_[b.whole], &memory, /*now=*/true);
    // A weight read in fp32 under copies has a storage of its own: it is read and written there.
    for (size_t s : b.singles) {
      if (!units_[s].gathered) gather(units_[s], &memory, /*now=*/true);
    }
  }
}

void ParameterShards::take_from_whole() {
  at::NoGradGuard no_grad;
  const auto rank = static_cast<size_t>(group_->rank());
  for (size_t i = 0; i < buckets_.size(); ++i) {
    const Bucket& b = buckets_[i];
    const Unit& whole = units_[b.whole];
    TORCH_CHECK(whole.gathered, "ParameterShards::take_from_whole: bucket ", i, " is not gathered");
    for (size_t s : b.singles) {  // what was written into a single goes back into the span first
      const Unit& single = units_[s];
      TORCH_CHECK(single.gathered, "ParameterShards::take_from_whole: a weight of bucket ", i, " is not gathered");
      whole.whole.narrow(0, single.from, single.whole.numel()).copy_(single.whole);
    }
    shards_[i].copy_(whole.whole.narrow(0, b.shards.begins[rank], b.shards.counts[rank]));
  }
  weights_changed();
}

ParameterGatherStats ParameterShards::take_stats() {
  ParameterGatherStats s = stats_;
  s.timed = !worker_ || worker_->timed();
  stats_ = {};
  return s;
}

}  // namespace ht

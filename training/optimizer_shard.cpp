#include "training/optimizer_shard.h"

#include "training/optimizer.h"

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <numeric>

namespace ht {
namespace {

// The tensors' elements as one flat view of their storage; they must lie one after another.
at::Tensor flat_span(const std::vector<at::Tensor>& members) {
  const at::Tensor& first = members.front();
  int64_t n = 0;
  for (const at::Tensor& t : members) {
    TORCH_CHECK(t.is_non_overlapping_and_dense() && t.storage().is_alias_of(first.storage()) &&
                    t.storage_offset() == first.storage_offset() + n,
                "OptimizerShard: a bucket's parameters do not lie one after another in one block");
    n += t.numel();
  }
  at::Tensor flat = at::empty({0}, first.options().requires_grad(false));
  flat.set_(first.storage(), first.storage_offset(), {n}, {1});
  return flat;
}

}  // namespace

at::Tensor memory_order(const at::Tensor& t) {
  std::vector<int64_t> dims(static_cast<size_t>(t.dim()));
  std::iota(dims.begin(), dims.end(), 0);
  std::stable_sort(dims.begin(), dims.end(), [&](int64_t a, int64_t b) { return t.stride(a) > t.stride(b); });
  return t.permute(dims).view({-1});
}

at::Tensor from_memory_order(const at::Tensor& flat, const at::Tensor& like) {
  at::Tensor out = at::empty_strided(like.sizes(), like.strides(), flat.options());
  memory_order(out).copy_(flat);
  return out;
}

OptimizerShard::OptimizerShard(std::shared_ptr<Communicator> group, std::vector<at::Tensor> params,
                               const std::vector<std::vector<size_t>>& buckets, const GradientBuffer* gradients,
                               const std::vector<at::Tensor>* parameter_shards)
    : group_(std::move(group)), params_(std::move(params)), pieces_of_shards_(parameter_shards != nullptr) {
  at::NoGradGuard no_grad;
  const auto rank = static_cast<size_t>(group_->rank());
  for (const std::vector<size_t>& members : buckets) {
    Bucket b;
    b.members = members;
    std::vector<at::Tensor> tensors;
    std::vector<int64_t> elements;
    for (size_t k : members) {
      tensors.push_back(params_[k]);
      elements.push_back(params_[k].numel());
    }
    // Sharded parameters have no whole span between uses: the bucket's shard stands for it.
    b.params = parameter_shards != nullptr ? (*parameter_shards)[buckets_.size()] : flat_span(tensors);
    if (gradients != nullptr) {
      b.grads = gradients->span(tensors);
      TORCH_CHECK(b.grads.defined(), "OptimizerShard: a bucket's gradients do not lie one after another in one block");
    }
    b.shards = shard_bucket(elements, group_->size());
    for (const ShardPiece& p : b.shards.pieces[rank]) {
      layout_.push_back(Piece{buckets_.size(), p});
      pieces_.push_back(parameter_shards != nullptr
                            ? (*parameter_shards)[buckets_.size()].narrow(0, p.at - b.shards.begins[rank], p.length)
                            : b.params.narrow(0, p.at, p.length));
    }
    buckets_.push_back(std::move(b));
  }
}

int64_t OptimizerShard::elements() const {
  int64_t n = 0;
  for (const at::Tensor& p : pieces_) n += p.numel();
  return n;
}

void OptimizerShard::attach_gradients() {
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const Piece& p = layout_[i];
    at::Tensor piece = pieces_[i];
    piece.mutable_grad() = param_of(p).grad().defined()
                               ? buckets_[p.bucket].grads.narrow(0, p.where.at, p.where.length)
                               : at::Tensor();
  }
}

void OptimizerShard::attach_gradients(const GradientShards& shards) {
  const auto rank = static_cast<size_t>(group_->rank());
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const Piece& p = layout_[i];
    const Bucket& b = buckets_[p.bucket];
    at::Tensor piece = pieces_[i];
    piece.mutable_grad() = shards.had_anywhere(b.members[p.where.member])
                               ? shards.shard(p.bucket).narrow(0, p.where.at - b.shards.begins[rank], p.where.length)
                               : at::Tensor();
  }
}

void OptimizerShard::detach_gradients() {
  for (at::Tensor piece : pieces_) piece.mutable_grad() = at::Tensor();
}

void OptimizerShard::gather_parameters() {
  TORCH_CHECK(!pieces_of_shards_, "OptimizerShard: sharded parameters are gathered where they are read");
  at::NoGradGuard no_grad;
  const auto start = std::chrono::steady_clock::now();
  const auto rank = static_cast<size_t>(group_->rank());
  stats_ = {};
  for (Bucket& b : buckets_) {
    at::Tensor own = b.params.narrow(0, b.shards.begins[rank], b.shards.counts[rank]);
    group_->all_gather(own, b.params, b.shards.counts, "the updated parameters");
    stats_.gather_bytes += (b.shards.elements - b.shards.counts[rank]) * static_cast<int64_t>(b.params.element_size());
  }
  stats_.gather_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

void OptimizerShard::take_state(torch::optim::Optimizer& full, torch::optim::Optimizer& sharded) const {
  at::NoGradGuard no_grad;
  const bool adamw = dynamic_cast<torch::optim::AdamW*>(&full) != nullptr;
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const at::Tensor& param = param_of(layout_[i]);
    std::vector<at::Tensor> state = optimizer_state(full, param);
    if (state.empty()) {
      drop_optimizer_state(sharded, pieces_[i]);
      continue;
    }
    const ShardPiece& w = layout_[i].where;
    for (size_t k = adamw ? 1 : 0; k < state.size(); ++k) {
      // In the parameter's own layout first: pieces are ranges of its memory order.
      at::Tensor aligned = at::empty_strided(param.sizes(), param.strides(), state[k].options());
      aligned.copy_(state[k]);
      state[k] = memory_order(aligned).narrow(0, w.offset, w.length).to(pieces_[i].device()).clone();
    }
    set_optimizer_state(sharded, pieces_[i], state);
  }
}

}  // namespace ht

// ParameterShards' schedule (parallel/parameter_shards.h): which buckets each block reads, what a
// block's beginning frees and gathers ahead, and what backward gathers ahead of the blocks it
// reaches.
#include "parallel/parameter_shards.h"

#include <algorithm>

namespace ht {

void ParameterShards::set_block_uses(const std::vector<std::vector<at::Tensor>>& block_params) {
  uses_.assign(block_params.size(), std::vector<bool>(buckets_.size(), false));
  for (size_t blk = 0; blk < block_params.size(); ++blk) {
    for (const at::Tensor& p : block_params[blk]) {
      auto it = member_of_.find(p.unsafeGetTensorImpl());
      if (it != member_of_.end()) uses_[blk][it->second.bucket] = true;
    }
  }
}

void ParameterShards::set_prefetch(std::shared_ptr<CollectiveQueue> worker, int depth) {
  TORCH_CHECK(!managed_, "ParameterShards: prefetching under a managed budget");
  worker_ = depth > 0 ? std::move(worker) : nullptr;
  depth_ = depth;
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
    if (!kept) release_bucket(b);
  }
  if (worker_) prefetch_blocks(blocks, /*backward=*/false);
}

void ParameterShards::prefetch_blocks(const std::vector<size_t>& blocks, bool backward) {
  for (size_t j : blocks) {
    for (size_t b = 0; b < buckets_.size(); ++b) {
      if (!uses_[j][b]) continue;
      for (size_t u : reading_units(b)) {
        if ((!backward || read_back_[u]) && !units_[u].gathered) gather(units_[u], nullptr, false);
      }
    }
  }
}

void ParameterShards::backward_will_read(const std::vector<at::Tensor>& weights) {
  backward_block_ = uses_.size();
  read_back_.assign(units_.size(), false);
  for (const at::Tensor& w : weights) {
    auto it = unit_of_.find(w.unsafeGetTensorImpl());
    if (it != unit_of_.end()) read_back_[it->second] = true;
  }
  // What forward left gathered and backward will not read goes now (under autocast the last
  // blocks' cast weights: backward reads their copies). Managed: the memory manager decides.
  if (managed_) return;
  for (size_t u = 0; u < units_.size(); ++u) {
    if (!read_back_[u] && units_[u].holds == 0) release_unless_staying(units_[u]);
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
    const bool reads = [&] {
      for (size_t b = 0; b < buckets_.size(); ++b) {
        if (!uses_[j][b]) continue;
        for (size_t u : reading_units(b))
          if (read_back_[u]) return true;
      }
      return false;
    }();
    if (reads) ahead.push_back(j);
  }
  prefetch_blocks(ahead, /*backward=*/true);
}

}  // namespace ht

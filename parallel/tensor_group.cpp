#include "parallel/tensor_group.h"

#include <vector>

namespace ht {

void TensorGroup::count(const at::Tensor& t, const char* what) {
  stats_.elements[what] += t.numel();
  stats_.bytes += static_cast<int64_t>(t.nbytes());
  if (std::string(what) == "recomputation") stats_.recomputed_bytes += static_cast<int64_t>(t.nbytes());
  ++stats_.calls;
}

void TensorGroup::allreduce_sum(at::Tensor& t, const char* what) {
  group_->allreduce_sum(t, what);
  count(t, what);
}

void TensorGroup::all_gather(const at::Tensor& shard, at::Tensor& full, const char* what) {
  group_->all_gather(shard, full, std::vector<int64_t>(static_cast<size_t>(size()), shard.numel()), what);
  count(full, what);
}

void TensorGroup::reduce_scatter_sum(const at::Tensor& full, at::Tensor& shard, const char* what) {
  group_->reduce_scatter_sum(full, shard, std::vector<int64_t>(static_cast<size_t>(size()), shard.numel()), what);
  count(full, what);
}

}  // namespace ht

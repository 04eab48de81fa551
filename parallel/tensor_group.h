#pragma once
// The runtime's TensorParallelGroup (runtime/tensor_parallel.h) over a Communicator: the ranks of
// one tensor-parallel group (ProcessGrid::tensor_parallel_group), with the elements each kind of
// collective was handed, by use, for the benchmark's count against the layout's formula.

#include "parallel/communicator.h"
#include "runtime/tensor_parallel.h"

#include <map>
#include <memory>
#include <string>

namespace ht {

struct TensorGroupStats {
  // Elements handed to collectives by this rank: an all-reduce's tensor, an all-gather's or a
  // reduce-scatter's whole (its size() pieces), keyed by the use (`what`).
  std::map<std::string, int64_t> elements;
  int64_t bytes = 0;  // all of them, in bytes
  int64_t recomputed_bytes = 0;  // of them, what recomputations repeated ("recomputation")
  int64_t calls = 0;
};

class TensorGroup final : public TensorParallelGroup {
 public:
  explicit TensorGroup(std::shared_ptr<Communicator> group) : group_(std::move(group)) {}
  int rank() const override { return group_->rank(); }
  int size() const override { return group_->size(); }
  void allreduce_sum(at::Tensor& t, const char* what) override;
  void all_gather(const at::Tensor& shard, at::Tensor& full, const char* what) override;
  void reduce_scatter_sum(const at::Tensor& full, at::Tensor& shard, const char* what) override;
  // One send and one receive, posted together (Communicator::post_group), so that the ranks'
  // sends to their next cannot block each other.
  std::unique_ptr<RingPass> pass_along_ring(const at::Tensor& out, at::Tensor& in, const char* what) override;
  Communicator& communicator() { return *group_; }
  const TensorGroupStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 private:
  void count(const at::Tensor& t, const char* what);
  std::shared_ptr<Communicator> group_;
  TensorGroupStats stats_;
};

}  // namespace ht

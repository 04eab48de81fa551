#pragma once
// Data-parallel training's gradient side: each rank of a group trains a replica on its slice of
// the global batch; before each optimizer step the gradients are averaged over the group. They
// are packed into buckets (parallel.bucket_mb) in reverse order of the parameters, the order
// backward produces them in, and each bucket is one all-reduce. This first version reduces the
// buckets after backward has finished; starting each bucket while backward still runs is next.

#include "parallel/communicator.h"

#include <memory>
#include <vector>

namespace ht {

struct DataParallelStats {
  double comm_ms = 0;      // time in all-reduce during the last average_gradients(), packing excluded
  int64_t comm_bytes = 0;  // bytes this rank sent into all-reduce
};

class DataParallel {
 public:
  DataParallel(std::shared_ptr<Communicator> group, std::vector<at::Tensor> params, int64_t bucket_bytes);

  int size() const { return group_->size(); }
  int rank() const { return group_->rank(); }
  Communicator& group() { return *group_; }

  // Rank 0's parameters and buffers on every rank (at start, and after resume).
  void broadcast_state(const std::vector<at::Tensor>& buffers);
  // Every parameter's .grad() becomes the mean over the group. A parameter that has no gradient
  // on this rank takes part with zeros (and gets the mean); one with no gradient anywhere stays
  // without.
  void average_gradients();
  // The group's mean of a per-rank number (the loss of its slice, for logging).
  double mean(double value, const char* what);

  // The buckets, as indices into the parameters, in reduction order.
  const std::vector<std::vector<size_t>>& buckets() const { return buckets_; }
  const DataParallelStats& stats() const { return stats_; }

 private:
  std::shared_ptr<Communicator> group_;
  std::vector<at::Tensor> params_;
  std::vector<std::vector<size_t>> buckets_;
  DataParallelStats stats_;
};

}  // namespace ht

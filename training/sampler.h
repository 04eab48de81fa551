#pragma once
// The order in which training samples are visited: a permutation per epoch determined by
// (seed, epoch) alone, so any position can be resumed exactly without saved generator state.
// Each global batch is a contiguous run of that order; with several data-parallel ranks, rank r
// takes the r-th equal slice of it, so N ranks see exactly the global batches of one rank.

#include <ATen/ATen.h>

#include <cstdint>

namespace ht {

struct SamplerPosition {
  int64_t epoch = 0;
  int64_t batch = 0;  // global batches already taken in this epoch
};

class Sampler {
 public:
  Sampler(int64_t dataset_size, int64_t global_batch, uint64_t seed, bool shuffle, int64_t rank = 0,
          int64_t world = 1);

  int64_t batches_per_epoch() const { return size_ / global_batch_; }  // the last partial batch is dropped
  // This rank's sample indices (int64) of the next global batch; moves to the next epoch as needed.
  at::Tensor next();
  SamplerPosition position() const { return pos_; }
  void seek(SamplerPosition position);

 private:
  const at::Tensor& order();

  int64_t size_, global_batch_;
  uint64_t seed_;
  bool shuffle_;
  int64_t rank_, world_;
  SamplerPosition pos_;
  int64_t order_epoch_ = -1;
  at::Tensor order_;
};

}  // namespace ht

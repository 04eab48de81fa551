#pragma once
// Sharded optimizer state (parallel.shard = "optimizer", ZeRO's first stage): each rank of a
// data-parallel group keeps and updates the optimizer state of its share of the parameters only,
// 1/N of it. At the first level the gradients are all-reduced whole as without sharding; at the
// second (parallel/gradient_shards.h) each rank receives only its range of each bucket's sum.
// At the third (parallel/parameter_shards.h) the parameters live as each rank's range too, and the
// pieces are views of that range.
//
// The parameters lie in one block in DataParallel's reduction order (Trainer places them so), as
// the gradients do in theirs; so each bucket of both is one flat span, and a rank's share of a
// bucket (parallel/shard_layout.h) is one range of it. The optimizer steps *pieces*: 1-D views
// of the parameter block, one per parameter the range cuts, whose gradients are the same range
// of the gradient block. AdamW and SGD work element by element, so stepping the pieces changes
// exactly the bits stepping the whole parameters would; a parameter without a gradient keeps its
// pieces without one, and the optimizer skips them as it skips the parameter. After the step, one
// all-gather per bucket, in place, gives every rank every rank's updated pieces.
//
// Within pipeline stages (ZeRO-1 only) the parameters are the stage's, as DataParallel over the
// stage holds them: each stage's replicas split that stage's state.
//
// Checkpoints: each rank writes its pieces (parameters and state) as slices of the whole tensors
// (training/slice_files.h) and reads back the ranges its pieces cover at whatever count
// resumes. A whole checkpoint (an unsharded run's) resumes sharded through take_state.

#include "alloc/gradient_buffer.h"
#include "parallel/communicator.h"
#include "parallel/gradient_shards.h"
#include "parallel/shard_layout.h"

#include <torch/optim/optimizer.h>

#include <memory>
#include <vector>

namespace ht {

struct ShardStats {
  double gather_ms = 0;      // the all-gathers of the updated parameters, last step
  int64_t gather_bytes = 0;  // bytes this rank received in them
  int64_t drops = 0;         // sharded parameters: gathered buckets the memory manager dropped
  double gather_hidden = 0;  // sharded parameters, prefetched: the share of gather_ms hidden under compute
};

class OptimizerShard {
 public:
  // `params`: DataParallel's parameters (its indices), `buckets` its buckets in reduction order;
  // each bucket's parameters must lie one after another in one block, and their gradients in
  // `gradients` likewise (the trainer lays both out so); null `gradients`: sharded gradients.
  // `parameter_shards`: sharded parameters (parallel/parameter_shards.h), this rank's range of
  // each bucket, which the pieces are views of instead of the parameters' storage; then there
  // is nothing to gather after the step (the next forward gathers).
  OptimizerShard(std::shared_ptr<Communicator> group, std::vector<at::Tensor> params,
                 const std::vector<std::vector<size_t>>& buckets, const GradientBuffer* gradients,
                 const std::vector<at::Tensor>* parameter_shards = nullptr);

  // What this rank's optimizer steps: 1-D views of the parameters' storage, in bucket order.
  const std::vector<at::Tensor>& pieces() const { return pieces_; }
  // pieces()[i] is elements [offset, offset + length) of `param`'s memory order.
  struct PieceOf {
    const at::Tensor* param;
    int64_t offset, length;
  };
  PieceOf piece_of(size_t i) const {
    const ShardPiece& w = layout_[i].where;
    return {&param_of(layout_[i]), w.offset, w.length};
  }
  // Elements of the model this rank updates (the sum of its pieces).
  int64_t elements() const;

  // Each piece's gradient becomes the same range of its parameter's gradient slot, or none where
  // the parameter has no gradient (call after the gradients are averaged).
  void attach_gradients();
  // The same from sharded gradients (made over the same buckets): each piece's gradient is its
  // range of this rank's share, or none where its parameter had none on any rank.
  void attach_gradients(const GradientShards& shards);
  void detach_gradients();
  // Every rank's updated pieces into every rank's parameters: one all-gather per bucket.
  void gather_parameters();
  const ShardStats& stats() const { return stats_; }

  // Local: `sharded` takes this rank's share of `full`'s state (a loaded checkpoint's).
  void take_state(torch::optim::Optimizer& full, torch::optim::Optimizer& sharded) const;

 private:
  struct Bucket {
    std::vector<size_t> members;  // indices into params_, in span order
    at::Tensor params, grads;     // the flat spans
    BucketShards shards;
  };
  struct Piece {
    size_t bucket = 0;
    ShardPiece where;  // `where.member` indexes the bucket's members
  };
  const at::Tensor& param_of(const Piece& p) const { return params_[buckets_[p.bucket].members[p.where.member]]; }

  std::shared_ptr<Communicator> group_;
  std::vector<at::Tensor> params_;
  std::vector<Bucket> buckets_;
  std::vector<Piece> layout_;       // one per piece, in bucket order
  std::vector<at::Tensor> pieces_;  // the optimizer's parameters, as layout_
  bool pieces_of_shards_ = false;   // views of sharded parameters' shards
  ShardStats stats_;
};

// A dense tensor's elements in memory order as a 1-D view (channels-last weights too), and a tensor
// laid out like `like` holding `flat` (memory order) in its elements.
at::Tensor memory_order(const at::Tensor& t);
at::Tensor from_memory_order(const at::Tensor& flat, const at::Tensor& like);

}  // namespace ht

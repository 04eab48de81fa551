#pragma once
// Data-parallel training's gradient side: each rank of a group trains a replica on its slice of
// the global batch; before each optimizer step the gradients are averaged over the group.
//
// They are packed into buckets (parallel.bucket_mb) in reverse order of the parameters, the order
// backward produces them in, and each bucket is one all-reduce. With a gradient buffer laid out in
// that order (reduction_order()), a bucket is a contiguous span of it and is reduced in place.
//
// With overlap, DataParallel listens to the last micro-batch's backward (GradientListener): when
// no tape entry left can add to any gradient of the next bucket, that bucket goes to the group's
// queue (parallel/collective_queue.h: a worker thread's all-reduce on CPU ranks, the communication
// stream's on a GPU) while backward goes on. Buckets start in bucket order on every rank, so
// the ranks' collectives always match, whatever order their gradients finish in.

#include "alloc/gradient_buffer.h"
#include "parallel/collective_queue.h"
#include "parallel/communicator.h"
#include "runtime/gradient_listener.h"

#include <memory>
#include <unordered_map>
#include <vector>

namespace ht {

struct DataParallelStats {
  // Time in the all-reduces of the last step's gradients (packing excluded); -1 where the host
  // does not see it (a GPU's communication stream: its kernels are not timed here).
  double comm_ms = 0;
  int64_t comm_bytes = 0;  // bytes this rank sent into them
  double wait_ms = 0;      // time the host waited for them once backward had ended
  // Share of comm_ms hidden under backward: 1 - wait_ms / comm_ms (0 without overlap; -1 where
  // comm_ms is).
  double overlap = 0;
  // Buckets of the step, and those started while backward still ran (overlap): the evidence
  // that the gradient listener fired, which the times alone cannot give.
  int64_t buckets = 0, started_in_backward = 0;
};

class DataParallel final : public GradientListener {
 public:
  // `overlap` needs a queue for the group (make_collective_queue); it is ignored for a group of one.
  // `units`: per parameter, the unit it belongs to (a model's block); a bucket then never holds
  // two units' parameters (sharded parameters gather a block's buckets before it runs, FSDP's
  // unit). Empty: buckets by size alone.
  DataParallel(std::shared_ptr<Communicator> group, std::vector<at::Tensor> params, int64_t bucket_bytes,
               bool overlap = false, const std::vector<int>& units = {});

  int size() const { return group_->size(); }
  int rank() const { return group_->rank(); }
  Communicator& group() { return *group_; }
  const std::shared_ptr<Communicator>& shared_group() const { return group_; }
  bool overlaps() const { return worker_ != nullptr; }

  // The parameters it was made with (what buckets() index).
  const std::vector<at::Tensor>& parameters() const { return params_; }
  // The parameters that need gradients, in reduction order. A GradientBuffer made in this order
  // and passed to use_gradient_buffer() makes each bucket one span of it: reduced in place.
  std::vector<at::Tensor> reduction_order() const;
  void use_gradient_buffer(const GradientBuffer* buffer);

  // Rank 0's parameters and buffers on every rank (at start, and after resume).
  void broadcast_state(const std::vector<at::Tensor>& buffers);

  // GradientListener, for the backward of a step's last micro-batch only (an earlier one would
  // add to gradients being reduced): starts buckets as their gradients become final.
  void backward_begins(const std::vector<const c10::TensorImpl*>& pending) override;
  void gradient_ready(const at::Tensor& param) override;

  // Every parameter's .grad() becomes the mean over the group: starts the buckets backward did
  // not, and waits for all. A parameter that has no gradient on this rank takes part with zeros
  // (and gets the mean); one with no gradient anywhere stays without. In two halves:
  // begin_average() starts what backward did not (and returns while the worker reduces, with
  // parallel.overlap); finish_average() waits and writes the means.
  void average_gradients() {
    begin_average();
    finish_average();
  }
  void begin_average();
  void finish_average();
  // The group's mean of a per-rank number (the loss of its slice, for logging).
  double mean(double value, const char* what);

  // The buckets, as indices into the parameters, in reduction order.
  std::vector<std::vector<size_t>> buckets() const;
  // The same, as their parameters' element counts (what sharding splits; planner/shard_terms.h).
  std::vector<std::vector<int64_t>> bucket_elements() const;
  const DataParallelStats& stats() const { return stats_; }

 private:
  struct Bucket {
    std::vector<size_t> members;  // indices into params_
    at::Tensor span;              // the members' slots in the gradient buffer, when contiguous
    at::Tensor flat;              // being reduced this step
    int64_t pending = 0;          // members a tape entry may still add a gradient to
  };
  void start_ready_buckets();
  void start(Bucket& bucket);
  void reduce(at::Tensor flat, const char* what);  // queued with overlap, else now
  void write_means(const at::Tensor& had_anywhere);
  void reset_step();

  std::shared_ptr<Communicator> group_;
  std::vector<at::Tensor> params_;
  std::vector<Bucket> buckets_;
  std::unordered_map<const c10::TensorImpl*, size_t> bucket_of_;  // by the parameter's TensorImpl
  const GradientBuffer* buffer_ = nullptr;
  std::shared_ptr<CollectiveQueue> worker_;
  std::vector<float> had_here_;  // per parameter, this step: 1 if this rank had a gradient
  at::Tensor had_anywhere_;      // between begin_average and finish_average: their means
  size_t next_ = 0;              // the next bucket to start
  double inline_ms_ = 0;         // without a worker: time in all-reduce this step
  int64_t bytes_ = 0;
  DataParallelStats stats_;
};

}  // namespace ht

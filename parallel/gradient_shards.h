#pragma once
// Sharded gradients (parallel.shard = "gradients", ZeRO's second stage): each rank of a
// data-parallel group keeps only its share of the summed gradients, 1/N of them, instead of the
// whole gradient block that every rank keeps otherwise (alloc/gradient_buffer.h).
//
// Buckets are DataParallel's, sharded as OptimizerShard shards them (parallel/shard_layout.h): the
// same ranges of the same spans. A bucket's block, laid out as the gradient block would lay it
// out, exists only while its backward fills it: the tape asks for a parameter's slot (GradientSlots)
// the first time a backward gives it a gradient, and the block is made then, zero-filled. When no
// tape entry left can add to any of its gradients (GradientListener), the block is reduce-scattered
// into this rank's share, added into the rank's fp32 sum for the step, and freed, its parameters'
// gradients with it. Buckets start in bucket order on every rank, as DataParallel's all-reduces do.
//
// Every micro-batch's backward reduce-scatters (as DeepSpeed's stage 2 and FSDP without no_sync
// do): keeping a whole local sum across micro-batches would keep the whole block. So the sums
// add in another order than the unsharded run's (each micro-batch summed over the ranks, then the
// micro-batches; not each rank's micro-batches, then the ranks): the same within fp32's rounding,
// bit for bit where one micro-batch is summed by two ranks. The collectives run on the thread
// running backward, or on the group's queue (set_worker: sharded parameters' prefetch queue, or
// one of their own for parallel.overlap; a worker thread on CPU ranks, the communication stream
// on a GPU). With overlap (set_overlap) backward goes on while a bucket's reduce-scatter runs: at
// most one is under way, and the thread waits for it when the next bucket starts (or backward
// ends; on a GPU the compute stream waits), then frees its block. So a bucket's block lives from
// its first gradient to the start of the next bucket's reduce-scatter, at a point of the program,
// not of the clock: what is resident when, and so a budget's evictions, is the same on every run
// and every rank. The sums add in the same order as without overlap: the same bits.

#include "alloc/gradient_buffer.h"
#include "parallel/collective_queue.h"
#include "parallel/communicator.h"
#include "parallel/data_parallel.h"
#include "parallel/shard_layout.h"
#include "runtime/gradient_listener.h"

#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

namespace ht {

class GradientShards final : public GradientSlots, public GradientListener {
 public:
  // `params`: DataParallel's parameters (its indices); `buckets`: its buckets in reduction order;
  // `floating`: the type of a floating parameter's gradients where not its own (GradientBuffer's).
  GradientShards(std::shared_ptr<Communicator> group, std::vector<at::Tensor> params,
                 const std::vector<std::vector<size_t>>& buckets,
                 std::optional<at::ScalarType> floating = std::nullopt);

  // GradientSlots: `param`'s slot in its bucket's block, the block made on first use.
  at::Tensor slot(const at::Tensor& param) const override;

  // GradientListener, for every micro-batch's backward.
  void backward_begins(const std::vector<const c10::TensorImpl*>& pending) override;
  void gradient_ready(const at::Tensor& param) override;
  // Called with a bucket's index once it is reduce-scattered: no entry of this backward will add
  // to its gradients (sharded parameters free the bucket's gathered parameters then).
  void set_bucket_done(std::function<void(size_t)> done) { bucket_done_ = std::move(done); }
  // The group's collectives go through `worker` (which owns it while gathers may be under way).
  void set_worker(std::shared_ptr<CollectiveQueue> worker) { worker_ = std::move(worker); }
  // Reduce-scatters run on the worker while backward goes on (needs set_worker).
  void set_overlap(bool overlap) { overlap_ = overlap && worker_ != nullptr; }
  bool overlaps() const { return overlap_; }
  // After each backward: the buckets it did not start (parameters it gave no gradient), in order.
  void backward_ended();
  // After the step's last backward: which parameters had a gradient on some rank (one small
  // all-reduce), and the sums become means. Then shard() and had_anywhere() hold the step's.
  void finish_step();

  // This rank's share of bucket `b`'s mean gradient (in the gradients' type), its range of the span.
  const at::Tensor& shard(size_t b) const { return buckets_[b].sum; }
  bool had_anywhere(size_t param) const { return had_anywhere_[param] > 0; }
  // The gradients' bytes this rank keeps between steps (the shards).
  int64_t shard_bytes() const;
  // Of the last step: time in the reduce-scatters and the flags' all-reduce, bytes sent, buckets.
  const DataParallelStats& stats() const { return stats_; }

 private:
  struct Bucket {
    std::vector<size_t> members;  // indices into params_, in span order
    std::vector<int64_t> offsets;  // each member's first element in the span
    BucketShards shards;
    at::Tensor sum;               // this rank's range, summed over the step's micro-batches so far
    mutable at::Tensor block;     // the whole span, while a backward fills it
    int64_t pending = 0;          // members a tape entry may still add a gradient to
    bool reduced = false;         // in this backward
  };
  // A reduce-scatter under way (overlap): the block and the part it fills stay referenced here, so
  // they are freed on this thread once it has been waited for, never on a worker.
  struct InFlight {
    uint64_t ticket = 0;
    size_t bucket = 0;
    at::Tensor block, part;  // part: undefined where the collective fills the bucket's sum itself
    std::shared_ptr<double> ms;
  };
  void make_block(Bucket& b) const;
  void start_ready_buckets();
  void start(Bucket& b);
  void finish_in_flight();
  void reduce_now(Bucket& b);  // on this thread, or on the worker and waited for  // waits for the reduce-scatter under way, adds its part, frees its block
  void collective(const std::function<void(Communicator&)>& run);  // on the worker if any, waited for

  std::shared_ptr<Communicator> group_;
  std::vector<at::Tensor> params_;
  std::optional<at::ScalarType> floating_;
  mutable std::vector<Bucket> buckets_;
  std::unordered_map<const c10::TensorImpl*, std::pair<size_t, size_t>> where_;  // bucket, member
  std::vector<float> had_here_;      // per parameter, this step
  std::vector<float> had_anywhere_;  // per parameter, the last finished step
  std::function<void(size_t)> bucket_done_;
  std::shared_ptr<CollectiveQueue> worker_;
  bool overlap_ = false;
  std::optional<InFlight> in_flight_;
  double wait_ms_ = 0;               // of ms_, what this thread waited (all of it without overlap)
  size_t next_ = 0;                  // the next bucket to start in this backward
  int backwards_ = 0;                // reduced into the sums this step
  double ms_ = 0;
  int64_t bytes_ = 0;
  DataParallelStats stats_;
};

}  // namespace ht

#pragma once
// Sharded parameters (parallel.shard = "parameters", ZeRO's third stage, FSDP's FULL_SHARD): each
// rank of a data-parallel group keeps only its share of the parameters between uses, 1/N of
// them; a bucket's whole parameters are all-gathered from every rank just before a kernel reads
// one of them, and freed again once nothing will read them soon.
//
// Buckets are DataParallel's, sharded as the optimizer state and the gradients are
// (parallel/shard_layout.h): this rank's range of a bucket's span is its *shard*, a tensor of its
// own that the optimizer steps (OptimizerShard's pieces are views of it). Each bucket's
// parameters are views of one storage of their own; gathering allocates that storage's memory
// and all-gathers the shards into it, releasing frees it. The parameters' at::Tensors (their
// identity: names, tied uses, the optimizer's keys, gradient slots) never change.
//
// When (runtime/parameter_source.h): the interpreter asks before every read of a weight, so a
// bucket is gathered where it is first read in forward, again in backward, and wherever a
// recomputation reads it. It is freed
//   - in forward, when a block begins that does not use it (the model's block listener);
//   - in backward, once its gradients are final (GradientShards reduce-scattered it);
//   - after each backward and each evaluation, whatever is left.
// That is FSDP's default (reshard after forward), chosen for every bucket, and what happens
// without a memory budget. There the gathers are prefetched (set_prefetch): they run on a
// communication thread (parallel/collective_worker.h) that owns the group while a step runs,
// `depth` blocks ahead of the one computing: in forward the next blocks' buckets as a block
// begins; in backward, as the tape enters a block's entries (each records the block whose forward
// made it: backward_enters), the buckets of the blocks before it that backward will read (the
// weights the tape saved, backward_will_read: under autocast a block whose weights are all cast
// reads only the copies forward kept, and gets no gather). A read waits for its bucket's gather
// only if it is still under way. Prefetching is deterministic: it follows the block order and
// what every rank's tape saved alike, so every rank queues the same collectives in the same
// order. Under a budget with eviction (set_managed), forward frees nothing:
// a gathered bucket stays until the memory manager needs its room, weighed beside activations by
// the same score (cost: a modelled all-gather; its bytes; its staleness), or until backward is
// done with it. Every rank runs the same ops in the same order and decides these points alike; a
// budget keeps it so because evictions under parallel.shard = "parameters" weigh modelled costs
// only (the config refuses measured ones, host swap and static plans), so drops, recomputations
// and the gathers they need come at the same points on every rank.

#include "parallel/collective_worker.h"
#include "parallel/communicator.h"
#include "parallel/shard_layout.h"
#include "runtime/parameter_source.h"

#include <algorithm>
#include <memory>
#include <unordered_map>
#include <vector>

namespace ht {

struct ParameterGatherStats {
  int64_t gathers = 0;  // buckets gathered
  int64_t bytes = 0;    // bytes this rank received in them
  double ms = 0;        // time in the all-gathers (allocation included; on the communication thread when prefetched)
  double waited_ms = 0;  // of it, the time the thread computing waited for them (all of it without prefetch)
  int64_t drops = 0;    // gathered buckets the memory manager dropped for room
  // Share of the gathers' time hidden under compute: 1 - waited / ms.
  double hidden() const { return ms > 0 ? std::max(0.0, 1.0 - waited_ms / ms) : 0.0; }
};

// The modelled cost of gathering `bytes` again (what eviction weighs a gathered bucket by): a
// copy at runtime/kernel_cost.h's memory-bound rate. Deterministic, as every rank must agree.
double modeled_gather_ms(int64_t bytes);

class ParameterShards final : public ParameterSource {
 public:
  // `params`: DataParallel's parameters (its indices); `buckets`: its buckets in reduction order.
  // Each bucket's parameters move into a storage of their own (made in host memory: the whole
  // model never needs device memory), this rank's range is copied into its shard (device memory,
  // `device`), and the storage is freed. Rank 0's values must already be every rank's.
  ParameterShards(std::shared_ptr<Communicator> group, std::vector<at::Tensor> params,
                  const std::vector<std::vector<size_t>>& buckets, const at::Device& device);
  ~ParameterShards() override;

  // ParameterSource: gathers `weight`'s bucket unless it is gathered, and holds it while a
  // kernel's reads are open.
  void before_read(const at::Tensor& weight, MemoryHooks& memory, uint64_t now) override;
  void begin_reads() override { frames_.emplace_back(); }
  void end_reads() override;
  std::vector<DroppableParameters> droppable() const override;
  void drop(size_t id) override;
  // Under a budget with eviction: forward keeps gathered buckets for the memory manager to drop
  // (and nothing is prefetched: the manager decides what stays, not the block order).
  void set_managed(bool managed) { managed_ = managed; }
  // Gathers run on `worker` (which every other collective of the group must go through while
  // the step runs: GradientShards::set_worker), up to `depth` blocks ahead. Not with set_managed.
  void set_prefetch(std::shared_ptr<CollectiveWorker> worker, int depth);
  bool prefetches() const { return worker_ != nullptr; }

  // What each block of the model reads (its parameters and tied ones), in block order.
  void set_block_uses(const std::vector<std::vector<at::Tensor>>& block_params);
  // The model's block listener: block `block` begins (-1: the last has ended).
  void block_begins(int block);
  // ParameterSource: backward runs block `block`'s entries: gathers ahead of the blocks before it.
  void backward_enters(int block) override;
  // ParameterSource: a backward begins (reads until release_all are backward's) that reads these
  // weights: frees gathered buckets of no other (unless managed), and prefetches only those.
  void backward_will_read(const std::vector<at::Tensor>& weights) override;
  // Backward is done with bucket `b` (its gradients were reduce-scattered).
  void bucket_done(size_t b);
  // Every bucket freed (a gather under way first completes); ends a backward.
  void release_all() override;
  // Every bucket gathered (checkpoints): collective, every rank calls it.
  void gather_all(MemoryHooks& memory);
  // After whole parameters were written into the gathered buckets (a loaded checkpoint): each
  // shard takes its range of them.
  void take_from_whole();

  // This rank's share of each bucket, in bucket order: what its optimizer steps.
  const std::vector<at::Tensor>& shards() const { return shards_; }
  int64_t shard_bytes() const;
  // The largest bucket's bytes (a gathered bucket's size).
  int64_t largest_bucket_bytes() const;
  // Since the last call: the gathers.
  ParameterGatherStats take_stats();

 private:
  struct Bucket {
    std::vector<size_t> members;  // indices into params_
    at::Tensor whole;             // a flat view of the bucket's storage (its memory only while gathered)
    BucketShards shards;
    bool gathered = false;     // its memory is there (its data too, unless ticket is set)
    uint64_t ticket = 0;       // its gather, queued on the worker and not yet waited for
    int holds = 0;             // open kernel reads of it
    uint64_t last_access = 0;  // the interpreter's tick of its last read
  };
  // Its memory (through `memory`'s room-making, or plainly when null: not managed), then the
  // collective: inline, or queued on the worker (and waited for when `now`).
  void gather(Bucket& b, MemoryHooks* memory, bool now);
  void finish(Bucket& b);  // waits for its queued gather
  void release(Bucket& b);
  void prefetch_blocks(const std::vector<size_t>& blocks, bool backward);
  void reach(size_t block);  // backward has come to `block`: prefetch the `depth` before it

  std::shared_ptr<Communicator> group_;
  std::vector<at::Tensor> params_;
  std::vector<Bucket> buckets_;
  std::vector<at::Tensor> shards_;
  std::unordered_map<const c10::TensorImpl*, size_t> bucket_of_;
  std::vector<std::vector<bool>> uses_;  // per block: which buckets it reads
  std::vector<std::vector<size_t>> frames_;  // per open kernel, the buckets it read
  bool managed_ = false;
  std::shared_ptr<CollectiveWorker> worker_;
  int depth_ = 0;
  // Written by the worker, one per bucket: its last gather's time (shared, so that a worker left
  // running when training fails never writes into freed memory).
  std::shared_ptr<std::vector<double>> worker_ms_;
  size_t backward_block_ = 0;          // the block backward has reached (reads go down the blocks)
  std::vector<bool> read_back_;        // buckets this backward reads (the tape's saved weights)
  ParameterGatherStats stats_;
};

}  // namespace ht

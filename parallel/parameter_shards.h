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
// without a memory budget. Under a budget with eviction (set_managed), forward frees nothing:
// a gathered bucket stays until the memory manager needs its room, weighed beside activations by
// the same score (cost: a modelled all-gather; its bytes; its staleness), or until backward is
// done with it. Every rank runs the same ops in the same order and decides these points alike; a
// budget keeps it so because evictions under parallel.shard = "parameters" weigh modelled costs
// only (the config refuses measured ones, host swap and static plans), so drops, recomputations
// and the gathers they need come at the same points on every rank.

#include "parallel/communicator.h"
#include "parallel/shard_layout.h"
#include "runtime/parameter_source.h"

#include <memory>
#include <unordered_map>
#include <vector>

namespace ht {

struct ParameterGatherStats {
  int64_t gathers = 0;  // buckets gathered
  int64_t bytes = 0;    // bytes this rank received in them
  double ms = 0;        // time in the all-gathers (allocation included)
  int64_t drops = 0;    // gathered buckets the memory manager dropped for room
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
  // Under a budget with eviction: forward keeps gathered buckets for the memory manager to drop.
  void set_managed(bool managed) { managed_ = managed; }

  // What each block of the model reads (its parameters and tied ones), in block order.
  void set_block_uses(const std::vector<std::vector<at::Tensor>>& block_params);
  // The model's block listener: block `block` begins (-1: the last has ended).
  void block_begins(int block);
  // Backward is done with bucket `b` (its gradients were reduce-scattered).
  void bucket_done(size_t b);
  void release_all();
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
    bool gathered = false;
    int holds = 0;             // open kernel reads of it
    uint64_t last_access = 0;  // the interpreter's tick of its last read
  };
  void gather(Bucket& b, MemoryHooks& memory);
  void release(Bucket& b);

  std::shared_ptr<Communicator> group_;
  std::vector<at::Tensor> params_;
  std::vector<Bucket> buckets_;
  std::vector<at::Tensor> shards_;
  std::unordered_map<const c10::TensorImpl*, size_t> bucket_of_;
  std::vector<std::vector<bool>> uses_;  // per block: which buckets it reads
  std::vector<std::vector<size_t>> frames_;  // per open kernel, the buckets it read
  bool managed_ = false;
  ParameterGatherStats stats_;
};

}  // namespace ht

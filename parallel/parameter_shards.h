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
// without a memory budget. There the gathers are prefetched (set_prefetch): they run on the
// group's queue (parallel/collective_queue.h: a worker thread, or a GPU's communication stream)
// that owns the group while a step runs,
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
//
// 16-bit copies (keep_copies: training.compute_weights = "kept" under bf16 or fp16, FSDP's mixed
// precision, Megatron's bf16 parameters): each bucket also keeps its shard in the compute type,
// made again from the fp32 shard at its first gather after weights_changed() (once per optimizer
// step: the same rounding as one rank's WeightCopies), and the interpreter reads its weights'
// copies (ComputeWeights::copy_of): views of a 16-bit bucket whose storage is gathered and freed
// as the fp32 bucket is, half the bytes. A saved copy (the tape keeps the view) is gathered again
// where backward reads it; no cast lives from forward to backward. A weight read in fp32 (a norm's
// gain) is gathered alone, its own range of the span in fp32, never rounded: at its first such read
// it moves to a storage of its own (its at::Tensor stays the same), and from then on it is a unit
// of its own beside the bucket's copies, freed and prefetched with them. Checkpoints still gather
// the fp32 buckets whole.
//
// Resident (set_resident: parallel.shard = "optimizer" or "gradients" with 16-bit copies kept,
// Megatron's distributed optimizer, FSDP's SHARD_GRAD_OP): the fp32 parameters are the optimizer's
// masters, sharded with its state; the 16-bit copies and the weights read in fp32 are gathered at
// their first read after each optimizer step and stay gathered until the next one changes them.
// Only the fp32 buckets gathered whole (checkpoints) are freed as above. Gathered once a step, the
// copies keep no 16-bit shard: each rank rounds its fp32 shard into its own range of the gathered
// bucket and all-gathers in place.

#include "alloc/weight_copies.h"
#include "parallel/collective_queue.h"
#include "parallel/communicator.h"
#include "parallel/shard_layout.h"
#include "runtime/parameter_source.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

namespace ht {

struct ParameterGatherStats {
  int64_t gathers = 0;  // buckets gathered
  int64_t bytes = 0;    // bytes this rank received in them
  double ms = 0;        // time in the all-gathers (allocation included; on the communication thread when
                        // prefetched; on a GPU's communication stream, the time to queue them)
  double waited_ms = 0;  // of it, the time the thread computing waited for them (all of it without prefetch)
  int64_t drops = 0;    // gathered buckets the memory manager dropped for room
  bool timed = true;     // false on a GPU's stream: ms is the time to queue them, and hidden() -1
  // Share of the gathers' time hidden under compute: 1 - waited / ms; -1 where not timed.
  double hidden() const { return !timed ? -1.0 : ms > 0 ? std::max(0.0, 1.0 - waited_ms / ms) : 0.0; }
};

// The modelled cost of gathering `bytes` again (what eviction weighs a gathered bucket by): a
// copy at runtime/kernel_cost.h's memory-bound rate. Deterministic, as every rank must agree.
double modeled_gather_ms(int64_t bytes);

class ParameterShards final : public ParameterSource, public ComputeWeights {
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
  // Copies and fp32-read weights stay gathered from their first read to the next weights_changed().
  // Before keep_copies.
  void set_resident(bool resident) {
    TORCH_CHECK(!copies_dtype_, "ParameterShards::set_resident: after keep_copies");
    resident_ = resident;
  }
  bool resident() const { return resident_; }
  // Gathers run on `worker` (which every other collective of the group must go through while
  // the step runs: GradientShards::set_worker), up to `depth` blocks ahead. Not with set_managed.
  void set_prefetch(std::shared_ptr<CollectiveQueue> worker, int depth);
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

  // 16-bit copies in `dtype` (bf16 or fp16): what copy_of gives the interpreter from now on.
  void keep_copies(at::ScalarType dtype);
  // ComputeWeights: `weight`'s view in its bucket's 16-bit copies (gathered where it is read), or
  // undefined where the weight is not sharded or `dtype` is not the copies'.
  at::Tensor copy_of(const at::Tensor& weight, at::ScalarType dtype) override;
  // ComputeWeights: the shards were stepped (or loaded): each 16-bit shard is made again.
  void weights_changed() override;
  // ComputeWeights: this rank's 16-bit shards' bytes (resident: the copies gathered in the last
  // step, held from their first read to its end), and how many were made in the last step.
  int64_t bytes() const override;
  int64_t made_last_step() const override { return made_last_step_; }

  // This rank's share of each bucket, in bucket order: what its optimizer steps.
  const std::vector<at::Tensor>& shards() const { return shards_; }
  int64_t shard_bytes() const;
  // The largest bucket's bytes (a gathered bucket's size).
  int64_t largest_bucket_bytes() const;
  // Since the last call: the gathers.
  ParameterGatherStats take_stats();

 private:
  // One tensor all-gathered: a bucket's fp32 parameters, its 16-bit copies, or one of its members
  // read in fp32 under 16-bit copies.
  enum class Kind : uint8_t { kWhole, kCopies, kMember };
  struct Unit {
    Kind kind = Kind::kWhole;
    size_t bucket = 0;
    at::Tensor whole;             // flat, the memory of its storage only while gathered
    std::vector<int64_t> counts;  // each rank's part of it
    int64_t from = 0;             // kMember: its first element in the bucket's span
    bool gathered = false;        // its memory is there (its data too, unless ticket is set)
    uint64_t ticket = 0;          // its gather, queued on the group's queue and not yet waited for
    int holds = 0;                // open kernel reads of it
    uint64_t last_access = 0;     // the interpreter's tick of its last read
    // Written by the worker: its last gather's time (shared, so that a worker left running when
    // training fails never writes into freed memory).
    std::shared_ptr<double> worker_ms = std::make_shared<double>(0.0);
    int64_t bytes() const { return whole.numel() * static_cast<int64_t>(whole.element_size()); }
  };
  struct Bucket {
    std::vector<size_t> members;  // indices into params_
    std::vector<int64_t> at;      // each member's first element in the span
    BucketShards shards;
    size_t whole = 0;                 // its units
    std::optional<size_t> copies;
    std::vector<size_t> singles;      // members read in fp32 under copies, in the order first read
    at::Tensor shard16;               // this rank's range of the copies (keep_copies)
    uint64_t shard16_epoch = 0;       // weights_changed() count when it was made (0: never)
    bool copies_read = false;         // a 16-bit read of its copies has come (prefetch skips them till then, after a step)
  };
  struct Member {
    size_t bucket = 0;
    size_t position = 0;  // in the bucket's members
  };
  // Its memory (through `memory`'s room-making, or plainly when null: not managed), then the
  // collective: inline, or queued on the worker (and waited for when `now`).
  void gather(Unit& u, MemoryHooks* memory, bool now);
  void finish(Unit& u);  // waits for its queued gather
  void release(Unit& u);
  // Resident: a unit that stays gathered until the weights change (what is read between steps).
  bool stays(const Unit& u) const { return resident_ && u.kind != Kind::kWhole; }
  void release_unless_staying(Unit& u) {
    if (!stays(u)) release(u);
  }
  void release_bucket(size_t b);
  // What this rank sends of `u` (its 16-bit shard made again first where the weights changed).
  at::Tensor contribution(Unit& u);
  // `weight`, a member read in fp32 under copies: a unit of its own (made at its first such read).
  size_t single_of(const at::Tensor& weight, size_t whole_unit);
  // The units a read of bucket `b` gathers: its copies and singles under copies, else its whole.
  std::vector<size_t> reading_units(size_t b) const;
  void prefetch_blocks(const std::vector<size_t>& blocks, bool backward);
  void reach(size_t block);  // backward has come to `block`: prefetch the `depth` before it
  size_t add_unit(Unit u);

  std::shared_ptr<Communicator> group_;
  std::vector<at::Tensor> params_;
  std::vector<Bucket> buckets_;
  std::vector<Unit> units_;
  std::vector<at::Tensor> shards_;
  std::unordered_map<const c10::TensorImpl*, size_t> unit_of_;    // a parameter or a copy: its unit
  std::unordered_map<const c10::TensorImpl*, Member> member_of_;  // a parameter: its place
  std::unordered_map<const c10::TensorImpl*, at::Tensor> copy_views_;  // a parameter: its 16-bit view
  std::optional<at::ScalarType> copies_dtype_;
  uint64_t epoch_ = 1;
  int64_t made_ = 0, made_last_step_ = 0;
  std::vector<std::vector<bool>> uses_;  // per block: which buckets it reads
  std::vector<std::vector<size_t>> frames_;  // per open kernel, the units it read
  bool managed_ = false;
  bool resident_ = false;
  bool reads_known_ = false;  // a step has run: which buckets' copies are read is known
  int64_t held_copies_bytes_ = 0;  // resident: the copies gathered in the last step
  std::shared_ptr<CollectiveQueue> worker_;
  int depth_ = 0;
  size_t backward_block_ = 0;          // the block backward has reached (reads go down the blocks)
  std::vector<bool> read_back_;        // units this backward reads (the tape's saved weights)
  ParameterGatherStats stats_;
};

}  // namespace ht

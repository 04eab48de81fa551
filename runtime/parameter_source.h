#pragma once
// Where a weight's data comes from when it is not always resident: sharded parameters
// (parallel.shard = "parameters", parallel/parameter_shards.h) keep each rank's share only, and
// gather a bucket's whole parameters from every rank just before a kernel reads one of them.
// The interpreter asks before every read of a weight (a forward kernel, a recomputation, a
// backward entry), on the thread running them; every rank runs the same ops in the same order,
// so every rank asks at the same points and the gathers match. null: weights are always resident.
//
// Gathered memory the memory manager may free as it evicts activations: droppable() lists what
// no kernel in flight reads (the interpreter brackets each kernel's reads with begin_reads() and
// end_reads(); they nest, as a backward entry's reads contain the recomputations they trigger),
// with a modelled cost of gathering it again, and drop() frees one. The memory manager weighs
// them with the activations by the same score (memory/eviction_score.h).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace ht {

class MemoryHooks;

struct DroppableParameters {
  size_t id = 0;
  int64_t bytes = 0;
  double cost_ms = 0;         // modelled: the same on every rank, so every rank drops alike
  uint64_t last_access = 0;   // the interpreter's clock
};

class ParameterSource {
 public:
  virtual ~ParameterSource() = default;
  // `weight` (a parameter's at::Tensor, as given to Interpreter::param) is about to be read at the
  // interpreter's tick `now`: make its data resident. Memory it needs comes through `memory`
  // (run_with_room: the memory manager may evict activations to make room).
  virtual void before_read(const at::Tensor& weight, MemoryHooks& memory, uint64_t now) = 0;
  // Backward begins running the entries of model block `block` (as recorded by
  // Interpreter::set_block in forward): a source may gather ahead of the blocks before it.
  virtual void backward_enters(int block) {}
  // A backward begins whose entries saved (and so will read) exactly these weights: a source may
  // free what it holds of others (under autocast a cast weight's backward reads only its copy).
  virtual void backward_will_read(const std::vector<at::Tensor>& weights) {}
  // ...and these weights' casts (Tape::saved_weights): a profile of a step that casts learns
  // from it what a step keeping 16-bit copies would read again of them.
  virtual void backward_will_read_casts_of(const std::vector<at::Tensor>& weights) {}
  // A kernel's reads begin and end: what is read between them must stay resident.
  virtual void begin_reads() {}
  virtual void end_reads() {}
  // Gathered memory no kernel in flight reads, which the memory manager may drop.
  virtual std::vector<DroppableParameters> droppable() const { return {}; }
  virtual void drop(size_t id) {}
  // Frees everything it holds (the end of a forward that no backward follows: evaluation).
  virtual void release_all() {}
};

// Brackets one kernel's reads (null source: nothing).
class ParameterReads {
 public:
  explicit ParameterReads(ParameterSource* source) : source_(source) {
    if (source_ != nullptr) source_->begin_reads();
  }
  ~ParameterReads() {
    if (source_ != nullptr) source_->end_reads();
  }
  ParameterReads(const ParameterReads&) = delete;
  ParameterReads& operator=(const ParameterReads&) = delete;

 private:
  ParameterSource* source_;
};

}  // namespace ht

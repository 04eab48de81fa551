#pragma once
// The one interface between the two sides of the engine (DESIGN.md, "Layers"):
//   runtime -> memory: MemoryHooks, called by the interpreter around every kernel and every
//                      change of a tensor's residency;
//   memory -> runtime: Rematerializer, what a memory policy may ask of the interpreter.
// Leaves (parameters, inputs) are never reported: they are not the memory manager's to move.

#include <cstdint>
#include <vector>

namespace ht {

struct TensorInfo;
struct ComputePath;
class Tensor;

class MemoryHooks {
 public:
  virtual ~MemoryHooks() = default;
  // A kernel is about to run (fresh, or regenerating a dropped output): its inputs are resident
  // and pinned. This is where a budget makes room.
  virtual void before_kernel(const ComputePath& path, bool recompute) = 0;
  virtual void after_kernel(const ComputePath& path, bool recompute, double kernel_ms) = 0;
  // The backward of an op call is about to run (its saved values resident and pinned): its
  // gradients need room too.
  virtual void before_backward(const ComputePath& path) = 0;
  virtual void after_backward(const ComputePath& path) = 0;
  // A forward op call has run and its outputs have records (`taped`: the tape saved its values).
  virtual void forward_outputs(const ComputePath& path, const std::vector<Tensor>& outputs, bool taped) = 0;
  // A tape entry's backward is about to make its saved values resident and run / has run.
  virtual void backward_stage_begins(const ComputePath& path, const std::vector<const TensorInfo*>& saved) = 0;
  virtual void backward_stage_ends(const ComputePath& path) = 0;
  virtual void on_resident(TensorInfo& t) = 0;   // data attached (computed or regenerated)
  virtual void on_dropped(TensorInfo& t) = 0;    // data detached (evicted, or nobody reads it)
  virtual void on_destroyed(TensorInfo& t) = 0;  // the record itself is gone
};

class Rematerializer {
 public:
  virtual ~Rematerializer() = default;
  // Drop the data of an evictable tensor (TensorInfo::evictable()); it is regenerated on access.
  virtual void evict(TensorInfo& t) = 0;
  // Make a dropped tensor resident again by re-running the op calls that produced it.
  virtual void regenerate(TensorInfo& t) = 0;
  // The interpreter's clock (ticks, one per access): what staleness is measured in.
  virtual uint64_t now() const = 0;
};

}  // namespace ht

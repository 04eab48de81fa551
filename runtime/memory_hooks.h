#pragma once
// The one interface between the interpreter (runtime/) and the memory manager (memory/), declared
// by the interpreter, which knows no manager (docs/design.md, "Layout and the layer rule"):
//   runtime -> memory: MemoryHooks, called by the interpreter and its tape around every kernel,
//                      every change of a tensor's residency, and where host swap brings data or
//                      gradients back. Its defaults are a run without a manager: nothing is
//                      counted, evicted, swapped or timed.
//   memory -> runtime: Rematerializer, what a memory policy may ask of the interpreter.
// memory/memory_manager.h implements MemoryHooks; an interpreter is given its manager when it is
// made (Interpreter's constructor), so the manager outlives every record it accounts. Leaves (parameters, inputs) are never
// reported: they are not the memory manager's to move.

#include "alloc/out_of_memory.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace ht {

struct TensorInfo;
struct ComputePath;
class Tensor;
class Rematerializer;
class ParameterSource;

class MemoryHooks {
 public:
  virtual ~MemoryHooks() = default;
  // The interpreter these hooks serve, told by its constructor (and null by its destructor).
  virtual void bind(Rematerializer* interpreter) {}
  // A kernel is about to run (fresh, or regenerating a dropped output): its inputs are resident
  // and pinned. This is where a budget makes room.
  virtual void before_kernel(const ComputePath& path, bool recompute) {}
  virtual void after_kernel(const ComputePath& path, bool recompute, double kernel_ms) {}
  // Whether anything reads kernels' measured times (ComputePath::kernel_ms()); on a GPU, kernels
  // get CUDA events only then.
  virtual bool reads_kernel_times() const { return false; }
  // A kernel threw OutOfBudget (an allocation on an ATen worker thread, which may not evict):
  // make room for what it held then plus what it asked. True: run it again.
  virtual bool make_room_after(const OutOfBudget& failure) { return false; }
  // The backward of an op call is about to run (its saved values resident and pinned): its
  // gradients need room too.
  virtual void before_backward(const ComputePath& path) {}
  virtual void after_backward(const ComputePath& path) {}
  // A forward op call has run and its outputs have records (`taped`: the tape saved its values).
  virtual void forward_outputs(const ComputePath& path, const std::vector<Tensor>& outputs, bool taped) {}
  // Whether backward_stage_begins/ends are wanted (static plans); the tape gathers `saved` only then.
  virtual bool watches_backward_stages() const { return false; }
  // A tape entry's backward is about to make its saved values resident and run / has run.
  virtual void backward_stage_begins(const ComputePath& path, const std::vector<const TensorInfo*>& saved) {}
  virtual void backward_stage_ends(const ComputePath& path) {}
  virtual void on_resident(TensorInfo& t) {}   // data attached (computed or regenerated)
  virtual void on_dropped(TensorInfo& t) {}    // data detached (evicted, or nobody reads it)
  virtual void on_destroyed(TensorInfo& t) {}  // the record itself is gone

  // Host swap. A dropped tensor with a copy in host memory comes back by the copy (asked before
  // the interpreter would recompute it); backward prefetches saved values `prefetch_lookahead()`
  // entries ahead (false: no room now).
  virtual bool comes_back_by_copy(const TensorInfo& t) const { return false; }
  virtual at::Tensor swap_in(TensorInfo& t);  // only where comes_back_by_copy(t)
  virtual int prefetch_lookahead() const { return 0; }
  virtual bool prefetch(TensorInfo& t) { return false; }
  // `t` was released (nobody will read it): its host copy goes too.
  virtual void release_host_copy(TensorInfo& t) {}
  // Backward's gradients in flight (TensorInfo::grad of records whose producer's entry has not
  // run yet): the tape tells when it sets one, and takes it (brought back if it was parked on
  // host; undefined if none) through take_gradient.
  virtual void gradient_pending(TensorInfo& t) {}
  virtual at::Tensor take_gradient(TensorInfo& t);
};

// Runs `kernel`; when it throws OutOfBudget, asks `memory` for room and runs it again (kernels
// are functional; random ones replay their seed). Rethrows when nothing more can be freed.
template <typename Kernel>
auto run_with_room(MemoryHooks& memory, Kernel&& kernel) -> decltype(kernel()) {
  for (int attempt = 1;; ++attempt) {
    try {
      return kernel();
    } catch (const OutOfBudget& e) {
      if (attempt > 8 || !memory.make_room_after(e)) throw;
    }
  }
}

class Rematerializer {
 public:
  virtual ~Rematerializer() = default;
  // Drop the data of an evictable tensor (TensorInfo::evictable()); it is regenerated on access.
  virtual void evict(TensorInfo& t) = 0;
  // Make a dropped tensor resident again by re-running the op calls that produced it.
  virtual void regenerate(TensorInfo& t) = 0;
  // The interpreter's clock (a tick per kernel: forward, backward or recomputation): what staleness is
  // measured in.
  virtual uint64_t now() const = 0;
  // Where gathered weights come from (sharded parameters): memory the manager may drop too.
  virtual ParameterSource* parameter_source() const { return nullptr; }
};

}  // namespace ht

#pragma once
// Reverse mode: a tape of the op calls that need gradients, recorded during forward and walked
// in reverse by backward(). Each entry holds handles on exactly the values its backward reads
// (declared by the op), and lets go of them as soon as the entry has run.

#include "runtime/gradient_listener.h"
#include "runtime/tensor.h"

#include <memory>
#include <unordered_map>
#include <vector>

namespace ht {

struct TapeEntry {
  std::shared_ptr<ComputePath> path;
  std::vector<Tensor> saved_inputs;   // per input: a handle if backward reads it, else empty
  std::vector<Tensor> saved_outputs;  // per output: likewise
  // After a BackwardPart::kInputs pass: the output gradients its weights' part will read.
  std::vector<at::Tensor> deferred_grads;
  int block = -1;  // the model block whose forward recorded it (Interpreter::set_block); -1: none
};

// Which gradients one backward computes. Zero-bubble pipeline schedules split it: the inputs'
// part is on the critical path (the previous stage waits for it); the weights' part can wait and
// fill a bubble. Each op computes the gradient of each input independently (its backward honours
// BackwardArgs::needs_input_grad), so the two parts give the same bits as one whole backward.
enum class BackwardPart {
  kAll,
  kInputs,   // every gradient but the weights' (Interpreter::param leaves); entries that owe a
             // weight gradient stay on the tape, with their output gradients, for...
  kWeights,  // ...this later pass over what kInputs left.
};

class Tape {
 public:
  void record(const std::shared_ptr<ComputePath>& path, const std::vector<Tensor>& outputs, int block = -1);
  void backward(Interpreter& interp, const std::vector<Tensor>& roots,
                const std::vector<at::Tensor>& grads, BackwardPart part = BackwardPart::kAll);
  void clear() { entries_.clear(); }
  // The weights the entries saved for backward (with repeats): as they are, and those whose casts
  // (a converting op's output read by a product) they saved: where 16-bit copies are kept, what
  // backward reads again as those copies.
  struct SavedWeights {
    std::vector<at::Tensor> as_is, casts;
  };
  SavedWeights saved_weights() const;
  // Moves every entry recorded so far into the returned tape (one pipeline micro-batch's forward).
  Tape take() {
    Tape taken;
    taken.entries_ = std::move(entries_);
    entries_.clear();
    return taken;
  }
  bool empty() const { return entries_.empty(); }
  size_t size() const { return entries_.size(); }

 private:
  // Runs one entry's backward for the inputs `part` selects; returns whether it still owes the
  // weights' part (kInputs only), its output gradients then kept in entry.deferred_grads.
  bool run_entry(Interpreter& interp, TapeEntry& entry, BackwardPart part);
  // Host swap: starts copying back the saved values of entries up to `lookahead` ahead of `now`
  // (in backward's order), from `ahead` on, while they fit; `ahead` moves past what was started.
  void prefetch_saved(Interpreter& interp, std::vector<TapeEntry>::reverse_iterator now,
                      std::vector<TapeEntry>::reverse_iterator& ahead, int lookahead);
  // For each leaf value that needs a gradient, the entries that take it as input; tells `listener`.
  std::unordered_map<const c10::TensorImpl*, int64_t> pending_leaves(GradientListener& listener) const;
  std::vector<TapeEntry> entries_;
};

// Adds `grad` to what `t` has accumulated; a leaf accumulates into its value's .grad() (a
// weight's 16-bit copy into its own sum, until flush_copy_gradient).
void accumulate_grad(TensorInfo& t, at::Tensor grad);
// Adds `grad` into `weight`'s gradient (its slot in `owner`'s gradient buffer, or its .grad()).
void add_to_weight(const at::Tensor& weight, Interpreter& owner, at::Tensor grad);
// A weight's 16-bit copy whose readers have all run: the sum of their gradients into the weight's.
void flush_copy_gradient(TensorInfo& copy);
// The tensor whose gradient a leaf's is: the weight of a 16-bit copy, else the leaf's own value.
inline const at::Tensor& gradient_target(const TensorInfo& leaf) {
  return leaf.grad_to.defined() ? leaf.grad_to : leaf.value;
}

}  // namespace ht

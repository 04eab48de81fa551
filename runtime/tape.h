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
};

class Tape {
 public:
  void record(const std::shared_ptr<ComputePath>& path, const std::vector<Tensor>& outputs);
  void backward(Interpreter& interp, const std::vector<Tensor>& roots,
                const std::vector<at::Tensor>& grads);
  void clear() { entries_.clear(); }
  size_t size() const { return entries_.size(); }

 private:
  void run_entry(Interpreter& interp, TapeEntry& entry);
  // For each leaf value that needs a gradient, the entries that take it as input; tells `listener`.
  std::unordered_map<const c10::TensorImpl*, int64_t> pending_leaves(GradientListener& listener) const;
  std::vector<TapeEntry> entries_;
};

// Adds `grad` to what `t` has accumulated; a leaf accumulates into its value's .grad().
void accumulate_grad(TensorInfo& t, at::Tensor grad);

}  // namespace ht

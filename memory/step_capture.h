#pragma once
// What one training step (a micro-batch's forward and backward) looked like to the interpreter,
// recorded while it runs: every forward op call with its signature (name, input shapes, which
// values it reads), the values it computed with their bytes and time, and every backward stage
// with the values it read and the memory it needed beyond them. finish() turns it into the plain
// schedule::StepGraph the plan solver reads, and a hash of the op sequence that names it.
//
// The capture never holds data: it keeps weak references to records, so recording a step
// changes nothing about how it runs.

#include "runtime/tensor.h"
#include "schedule/step_graph.h"

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

namespace ht {

class CpuArena;
struct ComputePath;
struct TensorInfo;

class StepCapture {
 public:
  // `arena`: where block sizes and the memory in use come from (never null: plans need a budget).
  // `fixed_bytes`: what the arena held when the step began (parameters, the batch).
  StepCapture(CpuArena* arena, int64_t fixed_bytes);

  // A kernel of the step begins / ends (fresh forward kernels and backward stages, never
  // recomputations): the capture measures what it needed beyond the values resident, counting
  // values evicted to make room for it (under DTR) as still there, as a plan would keep them.
  void kernel_begins();
  void kernel_ends();
  // Forward op call number forward_ops(), just run: its outputs (handles, hidden ones included);
  // `taped`: the tape saved what the op's traits declare. Returns the op's signature.
  uint64_t forward_op(const ComputePath& path, const std::vector<Tensor>& outputs, bool taped);
  // A backward stage, about to run (its saved values listed); its kernel_begins/ends follow,
  // then backward_stage_ran().
  void backward_stage(const ComputePath& path, const std::vector<const TensorInfo*>& saved);
  void backward_stage_ran();
  // The forward is over: values that someone besides the tape still holds cannot be dropped.
  void forward_done();
  // Residency of the step's values changed (the memory manager reports every change).
  void on_resident(const TensorInfo& t);
  void on_dropped(const TensorInfo& t);
  void on_destroyed(const TensorInfo& t);  // its weak reference has expired already

  // Value id of a record of this step (a view maps to its root's value); -1: not of this step.
  int value_of(const TensorInfo* t) const;
  // The record of a value, if it is still alive.
  std::shared_ptr<TensorInfo> record(int value) const { return records_[value].lock(); }
  int forward_index_of(const ComputePath* path) const;
  const std::vector<uint64_t>& signatures() const { return signatures_; }
  size_t forward_ops() const { return graph_.forward.size(); }
  size_t stages() const { return graph_.backward.size(); }

  // Fills derived fields; returns the hash of the op sequence.
  uint64_t finish();
  const schedule::StepGraph& graph() const { return graph_; }

 private:
  int add_value(const std::shared_ptr<TensorInfo>& record, int producer);
  int64_t bytes_of(const TensorInfo& t) const;
  // What the kernel just measured needed beyond fixed bytes, values resident and `outputs`.
  int64_t working_bytes(int64_t outputs) const;
  // Folds the arena's peak since the window began into kernel_peak_.
  void fold_window();

  CpuArena* arena_;
  schedule::StepGraph graph_;
  std::vector<uint64_t> signatures_;
  std::vector<std::weak_ptr<TensorInfo>> records_;  // per value
  std::vector<char> resident_;                      // per value
  std::vector<int> taped_;                          // per value: tape entries holding a handle
  std::unordered_map<const TensorInfo*, int> value_index_;
  std::unordered_map<const ComputePath*, int> forward_index_;
  int64_t resident_bytes_ = 0;
  int64_t resident_at_kernel_ = 0;  // value bytes resident when the kernel began
  // The last kernel's peak demand: the arena's peak, plus the bytes of values evicted during
  // the kernel before that peak.
  int64_t kernel_peak_ = 0;
  bool in_kernel_ = false;
  int64_t evicted_in_kernel_ = 0;  // value bytes dropped since the kernel began
};

}  // namespace ht

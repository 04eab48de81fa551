#pragma once
// The tensor interpreter: every op of training runs through Interpreter::apply(), which makes
// the inputs resident (regenerating dropped ones), runs and times the kernel, records the
// ComputePath and, when gradients are wanted, a tape entry for reverse mode. One per rank.

#include "alloc/gradient_buffer.h"
#include "alloc/weight_copies.h"
#include "runtime/gradient_listener.h"
#include "runtime/memory_hooks.h"
#include "runtime/op_time_log.h"
#include "runtime/op.h"
#include "runtime/parameter_source.h"
#include "runtime/tape.h"
#include "runtime/tensor.h"
#include "runtime/tensor_parallel.h"

#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

namespace ht {

enum class ExecutionMode {
  kInterpreted,  // our interpreter: tape, regeneration, memory manager
  kAutograd,     // reference: the same forward kernels recorded by libtorch's autograd
};

struct InterpreterOptions {
  ExecutionMode mode = ExecutionMode::kInterpreted;
  uint64_t seed = 0;  // stream of seeds for random ops and dynamic-graph choices
};

class Interpreter final : public Rematerializer {
 public:
  // `memory`: the memory manager that drives it (memory/memory_manager.h), which must outlive it;
  // null: none (MemoryHooks' defaults: nothing counted, evicted or swapped).
  explicit Interpreter(InterpreterOptions options = {}, MemoryHooks* memory = nullptr);
  ~Interpreter() override;
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  // Leaves. A parameter's gradient accumulates into its at::Tensor's .grad(), as in libtorch,
  // so torch::optim optimizers consume it directly.
  Tensor input(const at::Tensor& value);   // data, labels, masks: no gradient
  Tensor param(const at::Tensor& value);   // gradient iff value.requires_grad()
  // The activation a pipeline stage received from the previous one: a leaf that needs a gradient
  // (sent back) but is no weight; its gradient accumulates in value's .grad().
  Tensor stage_input(const at::Tensor& value);

  // The one place every op runs. Returns every output of the op, hidden ones included.
  std::vector<Tensor> apply(std::shared_ptr<const Op> op, const std::vector<Tensor>& inputs);

  // Reverse mode from a scalar loss (gradient 1), or from several roots with given gradients.
  void backward(const Tensor& loss);
  void backward(const std::vector<Tensor>& roots, const std::vector<at::Tensor>& grads);
  // Pipeline stages keep several micro-batches in flight: each forward's entries are taken off
  // the tape (take_tape(), after the forward) and its backward runs later on them alone, whole or
  // in the two parts of zero-bubble schedules (runtime/tape.h).
  Tape take_tape();
  void backward(Tape& tape, const std::vector<Tensor>& roots, const std::vector<at::Tensor>& grads,
                BackwardPart part = BackwardPart::kAll);

  // Gradient recording (off for evaluation). RAII: NoGradGuard.
  bool grad_enabled() const { return grad_enabled_; }
  void set_grad_enabled(bool enabled) { grad_enabled_ = enabled; }

  // Deterministic seed stream: random ops and dynamic-graph choices draw from it, so a run is
  // reproducible from InterpreterOptions::seed and identical in both execution modes.
  uint64_t next_seed();
  uint64_t seed_counter() const { return seed_counter_; }
  // Seeds drawn while a stream other than 0 is set are that stream's: the same counter, other
  // numbers. Ranks that split a layer draw their own parts' seeds in their own streams
  // (SeedStream); stream 0 is a single rank's.
  void set_seed_stream(uint64_t stream) { seed_stream_ = stream; }
  uint64_t seed_stream() const { return seed_stream_; }
  void set_seed_counter(uint64_t counter) { seed_counter_ = counter; }

  // Automatic mixed precision: before each op runs, its floating inputs are cast as the op
  // declares (OpTraits::precision) to `low` (bf16 or fp16) or to fp32. nullopt: off.
  void set_autocast(std::optional<at::ScalarType> low) { autocast_ = low; }
  std::optional<at::ScalarType> autocast() const { return autocast_; }
  // memory.compress: relu keeps a 1-bit mask for backward instead of its output (bit-identical
  // gradients; runtime/ops/relu_mask.cpp).
  void set_relu_masks(bool on) { relu_masks_ = on; }
  bool relu_masks() const { return relu_masks_; }
  // metrics.time_by_op: every kernel's time, by op, into `log` (null: none); it must outlive its use.
  void set_op_time_log(OpTimeLog* log) { op_times_ = log; }
  OpTimeLog* op_time_log() const { return op_times_; }
  // Within one forward every use of a weight shares one low-precision copy. backward() forgets
  // them (the tape keeps what it saved); a forward without backward (evaluation) calls this.
  // Released in the order they were cast: the cache's own order is the weights' heap addresses,
  // which differ from run to run (a traced step's frees did, launcher/planning/layer_traces.h).
  void clear_cast_cache();
  // training.compute_weights = "kept": where autocast casts a weight, it reads the weight's
  // 16-bit copy from `weights` instead, as a leaf whose gradient goes to the weight (interpreted
  // mode only: the autograd reference casts). null: a cast at each read.
  void set_compute_weights(ComputeWeights* weights) { compute_weights_ = weights; }
  bool reads_weight_copies() const { return compute_weights_ != nullptr; }

  ExecutionMode mode() const { return options_.mode; }
  // Parameters' gradients go into these slots (alloc/gradient_buffer.h); null: kept as computed.
  void set_gradient_buffer(const GradientSlots* buffer) { gradient_buffer_ = buffer; }
  const GradientSlots* gradient_buffer() const { return gradient_buffer_; }
  // Told when each leaf's gradient is final during backward(); null: nobody (runtime/gradient_listener.h).
  void set_gradient_listener(GradientListener* listener) { gradient_listener_ = listener; }
  GradientListener* gradient_listener() const { return gradient_listener_; }
  // Asked before every read of a weight (sharded parameters, runtime/parameter_source.h); null:
  // weights are resident while their records live.
  void set_parameter_source(ParameterSource* source) { parameter_source_ = source; }
  // The model block forward is in (the model's block listener; -1: none): tape entries record it,
  // and backward tells the parameter source as it reaches each block's entries.
  void set_block(int block) { block_ = block; }
  // The tensor-parallel group a split model's collective ops exchange with (runtime/tensor_parallel.h);
  // null: none (such an op then refuses to run).
  void set_tensor_parallel(TensorParallelGroup* group) { tensor_parallel_ = group; }
  TensorParallelGroup* tensor_parallel() const { return tensor_parallel_; }
  // The context-parallel group whose ranks hold pieces of each sequence (runtime/context_parallel.h):
  // context_attention exchanges keys and values with it. Null: none (context_attention is attention).
  void set_context_parallel(TensorParallelGroup* group) { context_parallel_ = group; }
  TensorParallelGroup* context_parallel() const { return context_parallel_; }
  // Keep every collective's outputs while their records live, as a non-recomputable op's
  // (runtime/op.h, OpTraits::collective): where the ranks of a group may choose differently what
  // to drop (static plans solved per rank, host swap by when copies finish, measured costs), no
  // rank may then recompute a collective the others do not. Off: DTR with modelled costs, whose
  // choices are the same on every rank, may drop and recompute them.
  void set_keep_collectives(bool keep) { keep_collectives_ = keep; }
  // Whether the outputs of `path` may be dropped and made again by running it.
  bool recomputes(const ComputePath& path) const {
    const OpTraits& t = path.op->traits();
    return t.recomputable && !(keep_collectives_ && t.collective);
  }
  ParameterSource* parameter_source() const override { return parameter_source_; }
  // The memory manager given to the constructor, or MemoryHooks' defaults.
  MemoryHooks& memory_hooks() { return *memory_; }
  const MemoryHooks& memory_hooks() const { return *memory_; }
  const Tape& tape() const { return tape_; }
  int64_t live_records() const { return live_records_; }

  // Rematerializer: what the memory manager (and tests) may ask. The clock advances once per
  // kernel (forward, regeneration or backward); a tensor's last access is the tick of the last
  // kernel that read or made it. The planner's replay keeps the same clock (planner/dtr_replay.h).
  void evict(TensorInfo& t) override;
  void regenerate(TensorInfo& t) override { materialize(t); }
  uint64_t now() const override { return tick_; }

  // --- Used by Tensor, Tape and TensorInfo; not for model code. ---
  // Makes `t` resident, re-running its producers from an explicit work stack (no recursion:
  // chains can be thousands of ops long).
  const at::Tensor& materialize(TensorInfo& t);
  void on_handle_acquired(TensorInfo& t) { ++t.handle_refs; }
  void on_handle_released(TensorInfo& t);
  void on_record_destroyed(TensorInfo& t);
  uint64_t tick() { return ++tick_; }  // a kernel is about to run

 private:
  friend class Tape;
  std::shared_ptr<TensorInfo> new_record(const at::Tensor& value);
  Tensor make_leaf(const at::Tensor& value, bool requires_grad);
  // The inputs cast for autocast, or empty when the op takes them as they are (runtime/interpreter_autocast.cpp).
  std::vector<Tensor> autocast_inputs(const Op& op, const std::vector<Tensor>& inputs);
  Tensor cast_for_autocast(const Tensor& x, at::ScalarType dtype);
  // The weight's kept 16-bit copy as a leaf (set_compute_weights), or undefined: cast it.
  Tensor kept_copy(const at::Tensor& weight, at::ScalarType dtype);
  // `outputs` with each fp32 one cast to the low type (Precision::kLowOutput).
  std::vector<Tensor> autocast_outputs(std::vector<Tensor> outputs);
  // apply's work once the inputs are in the op's types: record and run it (or hand it to autograd).
  std::vector<Tensor> run(std::shared_ptr<const Op> op, const std::vector<Tensor>& inputs);
  std::vector<Tensor> apply_autograd(std::shared_ptr<const Op> op, const std::vector<Tensor>& inputs);
  // Runs path.op over its (resident) inputs, pinned meanwhile; times it.
  std::vector<at::Tensor> run_kernel(ComputePath& path, bool recompute);
  // A weight, or a view of one, is about to be read: the parameter source makes its data resident.
  void read_weight(const TensorInfo& t);
  void attach(TensorInfo& t, at::Tensor value);
  void drop(TensorInfo& t);
  void release_if_unused(TensorInfo& t);
  void link_alias(TensorInfo& out, const ComputePath& path, const at::Tensor& value,
                  size_t output_index);

  InterpreterOptions options_;
  MemoryHooks no_memory_;
  MemoryHooks* const memory_;
  Tape tape_;
  const GradientSlots* gradient_buffer_ = nullptr;
  GradientListener* gradient_listener_ = nullptr;
  ParameterSource* parameter_source_ = nullptr;
  ComputeWeights* compute_weights_ = nullptr;
  TensorParallelGroup* tensor_parallel_ = nullptr;
  TensorParallelGroup* context_parallel_ = nullptr;
  bool keep_collectives_ = false;
  int block_ = -1;
  bool grad_enabled_ = true;
  bool relu_masks_ = false;
  OpTimeLog* op_times_ = nullptr;
  uint64_t seed_counter_ = 0;
  uint64_t seed_stream_ = 0;
  uint64_t next_id_ = 0;
  uint64_t tick_ = 0;
  int64_t live_records_ = 0;
  std::optional<at::ScalarType> autocast_;
  struct CachedCast {
    at::Tensor weight;    // held: its address is the key and must not be reused meanwhile
    int64_t version = 0;  // its version counter when cast: an in-place update invalidates the copy
    Tensor copy;
  };
  std::map<std::pair<const void*, at::ScalarType>, CachedCast> cast_cache_;
  std::vector<std::pair<const void*, at::ScalarType>> cast_order_;  // the keys, as first cast
};

// Draws seeds from `stream` for a scope (Interpreter::set_seed_stream).
class SeedStream {
 public:
  SeedStream(Interpreter& interp, uint64_t stream) : interp_(interp), prev_(interp.seed_stream()) {
    interp_.set_seed_stream(stream);
  }
  ~SeedStream() { interp_.set_seed_stream(prev_); }
  SeedStream(const SeedStream&) = delete;
  SeedStream& operator=(const SeedStream&) = delete;

 private:
  Interpreter& interp_;
  uint64_t prev_;
};

// Turns gradient recording off for a scope (evaluation).
class NoGradGuard {
 public:
  explicit NoGradGuard(Interpreter& interp) : interp_(interp), prev_(interp.grad_enabled()) {
    interp_.set_grad_enabled(false);
  }
  ~NoGradGuard() { interp_.set_grad_enabled(prev_); }

 private:
  Interpreter& interp_;
  bool prev_;
};

}  // namespace ht

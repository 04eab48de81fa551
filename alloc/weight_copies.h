#pragma once
// The 16-bit compute copies of the weights (training.compute_weights = "kept", the precision
// layout of Megatron's bf16 parameters beside fp32 master weights): one block per type and device,
// made once, each weight's copy refreshed once per optimizer step, at its first read after the
// step (or after anything else changed the weight). Autocast then reads the copy where it would
// have cast the weight: no cast per micro-batch, per recomputation, nor a cast back per gradient.
//
// Which weights have copies is what the first step's forward cast (the interpreter asks for each
// weight it casts, and is told to cast it itself until the block exists); the block is laid out
// at the first weights_changed() after that, between steps, when no activation is alive.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

namespace ht {

// What the interpreter asks (Interpreter::set_compute_weights).
class ComputeWeights {
 public:
  virtual ~ComputeWeights() = default;
  // `weight`'s current copy in `dtype`, or undefined: cast it at this read.
  virtual at::Tensor copy_of(const at::Tensor& weight, at::ScalarType dtype) = 0;
  // The weights were updated (an optimizer step, a checkpoint read): every copy is made again at
  // its next read.
  virtual void weights_changed() = 0;
  // Bytes the copies keep between steps, and copies made between the last two weights_changed()
  // calls (a step's forwards and recomputations): the evidence that each is made once per step.
  virtual int64_t bytes() const = 0;
  virtual int64_t made_last_step() const = 0;
};

// One rank's whole copies. (Under sharded parameters, ParameterShards keeps them by shard.)

class WeightCopies final : public ComputeWeights {
 public:
  at::Tensor copy_of(const at::Tensor& weight, at::ScalarType dtype) override;
  // The first call after a forward lays out the block of the weights it cast.
  void weights_changed() override;
  // Bytes of the copies' block (0 until laid out) and weights in it.
  int64_t bytes() const override { return bytes_; }
  size_t size() const { return slots_.size(); }
  int64_t made_last_step() const override { return made_last_step_; }

 private:
  struct Wanted {
    at::Tensor weight;
    at::ScalarType dtype;
  };
  struct Slot {
    at::Tensor weight;  // held: its TensorImpl is the key
    at::Tensor copy;    // a view of the block, the weight's shape and strides
    uint64_t epoch = 0;    // weights_changed() count when last made (0: never)
    int64_t version = -1;  // the weight's version counter then
  };
  using Key = std::pair<const void*, at::ScalarType>;  // the weight's TensorImpl
  void lay_out();

  std::vector<Wanted> wanted_;  // cast by the first step's forward, in order
  std::map<Key, size_t> wanted_index_;
  std::map<Key, Slot> slots_;
  std::vector<at::Tensor> blocks_;
  int64_t bytes_ = 0;
  uint64_t epoch_ = 1;
  int64_t made_ = 0, made_last_step_ = 0;
};

}  // namespace ht

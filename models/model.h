#pragma once
// A model is a sequence of blocks, each taking one activation and returning the next, so that a
// later issue can cut it into pipeline stages. Parameters and buffers live in libtorch modules
// (names, serialization, .to(device) and torch::optim come for free); forward runs on the
// interpreter.

#include "runtime/interpreter.h"
#include "runtime/ops.h"

#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ht {

class Block : public torch::nn::Module {
 public:
  // The activation entering this block -> the activation leaving it.
  virtual Tensor forward(const Tensor& x) = 0;
  // Parameters this block uses that another block registers (a tied weight): a pipeline stage
  // holding this block but not the other keeps a copy and sums the two gradients before stepping.
  virtual std::vector<at::Tensor> shared_parameters() const { return {}; }
};

class Model : public torch::nn::Module {
 public:
  // Runs every block in order: the model's input -> its output (logits, or what logits() makes them of).
  Tensor forward(const Tensor& input);
  // Mean loss over the batch. Default: classification, output (N, K), target (N).
  virtual Tensor loss(const Tensor& output, const Tensor& target);
  // The logits of forward's output: the output itself, but where the loss applies the output
  // layer (a decoder on one rank: Decoder::loss).
  virtual Tensor logits(const Tensor& output) { return output; }
  const std::vector<std::shared_ptr<Block>>& blocks() const { return blocks_; }
  const std::vector<std::string>& block_names() const { return block_names_; }
  int64_t num_parameters() const;
  // Per parameter (in parameters() order), the index of the block that registers it; -1 for one
  // no block holds. Sharded parameters gather a block's parameters together (parallel/data_parallel.h).
  std::vector<int> parameter_blocks() const;
  // Per parameter (in parameters() order), whether each rank of a tensor-parallel group holds a
  // different part of it (models/decoder_split.h); false: every rank holds the same whole.
  virtual std::vector<bool> split_parameters() const { return std::vector<bool>(parameters().size(), false); }
  // Whether forward runs other ops from step to step (a path drawn from the interpreter's seeds):
  // one step's memory and work are then not every step's.
  virtual bool changes_every_step() const { return false; }
  // Per block, the parameters its forward reads: its own and the tied ones it uses.
  std::vector<std::vector<at::Tensor>> parameters_read_by_blocks() const;
  // Moves parameters and buffers to `device` and casts the floating ones to `float_dtype`.
  // (libtorch's Module::to(device, dtype) also casts integer and bool buffers.)
  void move_to(const at::Device& device, at::ScalarType float_dtype);
  // Stores 4-D parameters (convolution weights) channels-last (NHWC). ATen's convolution then
  // takes oneDNN's channels-last path (cuDNN's on a GPU), and its output, and what follows it
  // (batch norm, ReLU, pooling), stays channels-last: on the CPU max pooling runs 13x and a
  // ConvNet step 1.3x faster than in NCHW. Same arithmetic, other strides; call after move_to.
  // Returns how many weights it restrided (0: the model has no convolutions).
  int use_channels_last();
  // Called with a block's index before it runs, and with -1 after the last (a profiler
  // attributing kernels to blocks); empty: nobody.
  void set_block_listener(std::function<void(int)> listener) { block_listener_ = std::move(listener); }
  // Tells the listener, for callers that run the blocks themselves (a pipeline stage's chunk).
  void block_begins(int block) const {
    if (block_listener_) block_listener_(block);
  }

 protected:
  void add_block(const std::string& name, std::shared_ptr<Block> block);

 private:
  std::vector<std::shared_ptr<Block>> blocks_;
  std::vector<std::string> block_names_;
  std::function<void(int)> block_listener_;
};

}  // namespace ht

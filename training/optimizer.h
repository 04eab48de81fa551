#pragma once
// The optimizer (torch::optim's AdamW or SGD, each stepping a parameter in one fused pass:
// training/fused_optimizer.h), the learning-rate schedule (linear warmup, then constant or cosine
// decay) and global-norm gradient clipping.

#include "training/loss_scaler.h"
#include "training/optimizer_options.h"

#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ht {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerOptions& o,
                                                        const std::vector<at::Tensor>& params);

// Learning rate for the optimizer step with 0-based index `step` of `total_steps`.
double learning_rate_at(const OptimizerOptions& o, int64_t step, int64_t total_steps);
void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

// What clipping to `max_norm` multiplies the gradients by at global norm `norm` (a 0-dim double
// tensor): max_norm / (norm + 1e-6) where the norm exceeds max_norm > 0, else 1; undefined where
// max_norm <= 0 (no clipping). Computed in double where the norm is: the host's arithmetic, bit
// for bit, without the host reading the norm (on a GPU, the step then waits for nothing).
at::Tensor clip_coefficient(double max_norm, const at::Tensor& norm);
// Returns the global L2 norm of the gradients; when max_norm > 0 and the norm exceeds it, scales
// every gradient by max_norm / norm.
double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm);
// The per-parameter norms clip_grad_norm combines, one per defined gradient, and their combination
// (a 0-dim double tensor where the norms are; 0 on the CPU for none): a pipeline gathers the first
// across stages and combines them as one rank would.
at::Tensor gradient_norms(const std::vector<at::Tensor>& params);
at::Tensor combine_norms(const at::Tensor& norms);

// How a step's checks combine when the gradients are spread over ranks (pipeline stages, shards,
// tensor-parallel parts); empty: this rank holds the whole model.
struct StepAcrossStages {
  std::function<at::Tensor()> gradient_norm;  // the whole model's, a 0-dim double tensor
  std::function<bool(bool)> all_finite;       // every stage's answer
};

struct StepOutcome {
  // Of the unscaled gradients, before clipping: a 0-dim double tensor where the gradients are
  // (a CPU rank's outside its arena), read once the update is queued.
  at::Tensor grad_norm;
  bool stepped = true;  // false: a gradient was inf or NaN and the step was skipped
};
// The end of a training step, with the gradients of the whole global batch in place: with a
// scaler (fp16), unscale them and skip the step if any is not finite, leaving parameters and
// optimizer state untouched; then clip to `o.grad_clip`, set the learning rate and step. Without
// a scaler, and with the norm's collectives on the device (NCCL), nothing in it waits for the
// device: the fp16 scaler's decision is still read on the host (training/loss_scaler.h), and a
// pipeline stage's norm gathers its parameters' norms through the host (PipelineStage::gradient_norms).
StepOutcome optimizer_step(torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& params,
                           const OptimizerOptions& o, double lr, LossScaler* scaler,
                           const StepAcrossStages& stages = {});

// The optimizer's state of one parameter as tensors: AdamW {step (int64 scalar), exp_avg,
// exp_avg_sq}, SGD {momentum_buffer}; empty while it has none (never stepped). A pipeline stage
// sends them to rank 0 for a checkpoint in the one model-wide layout.
std::vector<at::Tensor> optimizer_state(torch::optim::Optimizer& optimizer, const at::Tensor& param);
// "adamw" or "sgd" (what a sliced checkpoint records, training/slice_files.h).
std::string optimizer_name(const torch::optim::Optimizer& optimizer);
// Tensors shaped to receive optimizer_state(param) of an optimizer of the same kind.
std::vector<at::Tensor> empty_optimizer_state(const torch::optim::Optimizer& optimizer, const at::Tensor& param);
// AdamW's moments are held from here in the type the optimizer keeps them in, whatever type
// `state` brings (a checkpoint written with the other training.optimizer_state_dtype).
void set_optimizer_state(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                         const std::vector<at::Tensor>& state);
// The same for every parameter's moments, after torch::optim's own load of a whole checkpoint.
void keep_moments_in_their_dtype(torch::optim::Optimizer& optimizer);
// Moves the optimizer state of `params` into one block per dtype and device, in parameter order,
// allocated now (at the arena's top, beside the parameters and their gradients). State made
// lazily in the first step lands between that step's temporaries, which leave holes in the
// memory that lives across steps when they go; activations then find less memory in one piece.
// A copy: the same bits. False if there is no state yet or no room for the copy (nothing moved).
bool compact_optimizer_state(torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& params);
// Replaces the optimizer state tensors of `params` (those with elements; not AdamW's step count)
// by `move(them)`, in parameter order: the old tensors go once nothing else holds them. False if
// there is no state yet (nothing moved).
bool move_optimizer_state(torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& params,
                          const std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>& move);
// An optimizer of the same kind and options, its state host copies of `optimizer`'s (over empty
// stand-ins for the parameters, whose values optimizer.save does not write): what
// optimizer.save writes, held still while training goes on (checkpoint.async), saved by any
// thread. One parameter group.
std::unique_ptr<torch::optim::Optimizer> host_copy_of(torch::optim::Optimizer& optimizer);
// Forgets `param`'s state (a pipeline stage keeps only its own parameters' state).
void drop_optimizer_state(torch::optim::Optimizer& optimizer, const at::Tensor& param);

// Sets every gradient to undefined (libtorch 1.13's zero_grad() zeroes in place instead).
void clear_grads(const std::vector<at::Tensor>& params);

}  // namespace ht

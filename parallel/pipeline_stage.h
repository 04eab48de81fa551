#pragma once
// One rank's part of a pipeline: it runs its schedule's actions (parallel/pipeline_schedule.h)
// over its chunks of the model, receiving activations from the previous stage and gradients from
// the next one, nonblocking, over the replica's pipeline group. Each forward's tape is kept apart
// (Interpreter::take_tape), so several micro-batches can be in flight and each backward runs over
// its own micro-batch alone; the zero-bubble schedules run it in two parts (runtime/tape.h).
//
// Bit-identity with one rank: each stage runs the same kernels on the same values (activations
// cross as bytes), weight gradients accumulate in micro-batch order as on one rank, dropout draws
// the seeds one rank would (each block's seeds are known from the layout), and the step's
// gradient norm is the one rank's formula over per-parameter norms gathered in model order.
//
// What the trainer adds around it (making the layout from the config, the whole model for a
// checkpoint) is in training/pipeline_setup.h.

#include "parallel/communicator.h"
#include "parallel/pipeline_layout.h"
#include "parallel/pipeline_links.h"
#include "runtime/interpreter.h"

#include <map>
#include <memory>
#include <optional>
#include <vector>

namespace ht {

struct PipelineStats {
  double compute_ms = 0;  // running this rank's forward and backward actions
  double wait_ms = 0;     // waiting for an activation or a gradient: the bubble, as this rank saw it
  int64_t p2p_bytes = 0;  // sent by this rank
  int peak_in_flight = 0; // micro-batch chunks whose forward had run and whose backward had not, at most
};

class PipelineStage {
 public:
  PipelineStage(Model& model, PipelineLayout layout, std::shared_ptr<Communicator> pipeline, at::Device device);

  int rank() const { return pipeline_->rank(); }
  const PipelineLayout& layout() const { return layout_; }
  Communicator& group() { return *pipeline_; }
  // Whether the model's loss is computed on this rank (it holds the last virtual stage).
  bool holds_loss() const;
  // The parameters this rank trains (model order).
  const std::vector<at::Tensor>& parameters() const { return params_; }
  // Whether `param` is a tied weight whose registering stage is another rank: this rank trains a
  // copy (the same values, stepped alike), and a checkpoint takes the other's.
  bool holds_tied_copy(const at::Tensor& param) const;

  // One step's actions over the batch (`input`, `target`: micro-batches of `micro_size`). Backward of each micro-batch
  // starts from loss x `loss_seed` (1 / micro-batches, times the fp16 loss scale). Returns the
  // mean loss over the micro-batches on the rank that holds the loss, 0 on the others: a {1}
  // double on the stage's device (a CPU rank's outside its arena), summed there micro-batch by
  // micro-batch without the host reading it. The batch's micro-batches are copied to the device
  // without blocking (staged in pinned memory by the trainer: training/dataset.h). The
  // interpreter's seed counter ends where one rank's would.
  at::Tensor train_step(Interpreter& interp, const at::Tensor& input, const at::Tensor& target, int64_t micro_size,
                    double loss_seed);
  const PipelineStats& stats() const { return stats_; }
  // How this stage posts its messages (chosen once, from the group's matching).
  Posting posting() const { return posting_; }

  // Evaluation of one batch of n: the model's output on the rank that holds the loss; undefined
  // elsewhere. Blocking, stage after stage.
  Tensor forward_only(Interpreter& interp, const at::Tensor& input, int64_t n);

  // A tied weight's two gradients (first and last stage) summed on both, in the same order, so
  // both copies step alike; a stage without one sends zeros in the gradients' type.
  void sum_tied_gradients();
  // The type of a floating parameter's gradients where not its own (training.gradient_dtype =
  // "bf16"; GradientBuffer's `floating`).
  void set_gradient_type(std::optional<at::ScalarType> floating) { floating_ = floating; }
  // Every parameter's gradient norm, gathered from the stage that trains it, in model order
  // (parameters without a gradient left out): what one rank's clip_grad_norm combines.
  at::Tensor gradient_norms();
  // Whether every stage's gradients are finite (fp16).
  bool all_stages(bool finite);
  // The sum over the stages of a value only some of them have (the loss: 0 elsewhere), in place.
  void sum(at::Tensor& value, const char* what);

  // A stage keeps only what it trains: the parameters (and buffers) of its blocks and the tied
  // weights they use move into device memory (the budget's arena, when one is active); every other
  // one becomes an empty tensor. The model was built on host memory (launcher/job.cpp).
  void keep_only_own(Model& model);
  // What keep_only_own left: per parameter and buffer (model order), its full size and whether
  // this rank holds it.
  struct Share {
    std::vector<std::vector<int64_t>> param_sizes, buffer_sizes;
    std::vector<bool> own_param, own_buffer;
  };
  const Share& share() const { return share_; }
  // The whole model's parameter count (a stage's tensors of other stages are empty).
  int64_t model_parameters() const { return model_parameters_; }

 private:
  std::optional<at::ScalarType> floating_;
  struct InFlight {
    Tape tape;
    Tensor input;   // the received activation (virtual stage > 0)
    Tensor output;  // sent to the next stage (not the last virtual stage)
    Tensor loss;    // the last virtual stage
  };
  using Key = std::pair<int, int>;  // (micro-batch, chunk)
  void forward(Interpreter& interp, const Action& a);
  void backward(Interpreter& interp, const Action& a);
  void post(const std::vector<PostedMessage>& group);
  at::Tensor take_received(const LinkMessage& m);
  void send(const at::Tensor& value, int vs, int micro_batch, bool gradient);
  void reap_sends(bool all);
  int tag(const LinkMessage& m) const;

  Model& model_;
  PipelineLayout layout_;
  std::shared_ptr<Communicator> pipeline_;
  at::Device device_;
  std::vector<Action> actions_;
  // The rank's actions with the groups of sends and receives posted between them: receives posted
  // ahead, each alone, where the link matches by tag (MPI); the first posting that runs on NCCL's
  // serial streams where it matches in posting order (parallel/pipeline_links.h).
  Posting posting_ = Posting::kAhead;
  std::vector<StreamItem> stream_;
  std::vector<at::Tensor> params_;
  std::vector<TiedParameter> tied_;
  Share share_;
  int64_t model_parameters_ = 0;
  // During a step.
  at::Tensor input_, target_;
  int64_t micro_size_ = 0;
  double loss_seed_ = 1;
  at::Tensor loss_sum_;
  uint64_t seed_base_ = 0;
  std::map<Key, InFlight> in_flight_;
  struct Receive {
    at::Tensor buffer;  // channels-last: its memory as an NHWC tensor (the wire's layout)
    std::shared_ptr<Transfer> transfer;  // its group's
  };
  std::map<LinkMessage, Receive> receives_;
  std::map<LinkMessage, at::Tensor> outbox_;  // produced, to be posted with the next group
  std::vector<std::shared_ptr<Transfer>> sends_;
  PipelineStats stats_;
};

}  // namespace ht

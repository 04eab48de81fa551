#pragma once
// The training loop. One step: the global batch is cut into micro-batches; each runs forward and
// backward through the interpreter (with automatic mixed precision if configured), the loss
// scaled by 1/micro-batches, gradients accumulating in fp32 in the parameters' .grad(); then the
// gradients are unscaled and checked (fp16), clipped, and the optimizer steps once with the
// scheduled learning rate. Evaluation, metrics and checkpoints happen at their intervals.

#include "launcher/config/config.h"
#include "launcher/data/dataset.h"
#include "launcher/data/sampler.h"
#include "launcher/report/run_output.h"
#include "launcher/training/checkpoint.h"
#include "alloc/cpu_arena.h"
#include "launcher/training/loss_scaler.h"
#include "launcher/training/optimizer.h"
#include "launcher/training/optimizer_shard.h"
#include "launcher/training/pipeline_setup.h"
#include "launcher/training/state_offload.h"
#include "parallel/data_parallel.h"
#include "parallel/parameter_shards.h"
#include "parallel/tensor_group.h"
#include "alloc/memory_timeline.h"
#include "memory/memory_manager.h"
#include "runtime/interpreter.h"
#include "runtime/op_time_log.h"

#include <torch/optim/optimizer.h>

#include <functional>

#include <map>
#include <memory>
#include <set>
#include <optional>

namespace ht {

struct EvalResult {
  double loss = 0;
  std::optional<double> accuracy;    // classification
  std::optional<double> perplexity;  // language models
  // Language models whose data knows its bytes of text per token: loss / ln 2 / bytes per token,
  // the one number that compares across vocabularies (characters, SentencePiece, GPT-2's).
  std::optional<double> bits_per_byte;
  int64_t samples = 0;
  double seconds = 0;  // wall time of the evaluation, this rank's
};

struct TrainResult {
  int64_t steps = 0, resumed_from_step = 0;
  double final_loss = 0;
  std::optional<EvalResult> eval;
  int64_t mem_peak_bytes = -1;  // -1: not measured on this device
  double seconds = 0;
  int64_t samples = 0;
  int stopped_by = 0;  // the signal that stopped training after `steps` (stop_signals.h); 0: ran to the end
};

// Whether a tensor-parallel rank keeps its collectives' outputs (Interpreter::set_keep_collectives):
// under every memory policy but DTR with modelled costs.
bool keeps_collectives(const Config& config);

class Trainer {
 public:
  // Checks that model, data and batch sizes fit (UserError otherwise) and writes nothing.
  // `arena`: the device memory of config.memory.budget, already active (ArenaScope); null for
  // unlimited memory. `replicas`: the data-parallel group this rank trains in (its size is
  // config.parallel.data_parallel); by default a group of one. Parameters and buffers are made
  // rank 0's here, and again after resume_from(). `pipeline`: the replica's pipeline group when
  // config.parallel.pipeline_parallel > 1 (its rank is this rank's stage). `tensor`: the
  // tensor-parallel group when config.parallel.tensor_parallel > 1, whose ranks hold the other
  // parts of `model` (models/decoder_split.h).
  Trainer(const Config& config, DataSplits data, std::shared_ptr<Model> model,
          std::shared_ptr<CpuArena> arena = nullptr, std::shared_ptr<Communicator> replicas = nullptr,
          std::shared_ptr<Communicator> pipeline = nullptr, std::shared_ptr<Communicator> tensor = nullptr);

  // Continues from a verified checkpoint folder.
  void resume_from(const std::string& folder);
  // Trains to the configured step count, writing metrics and checkpoints into `output` (null on
  // data-parallel ranks other than 0, which write nothing).
  TrainResult run(RunOutput* output);
  EvalResult evaluate();
  // Ends the memory trace now (the run stops early).
  void close_trace() {
    memory_.set_timeline(nullptr);
    timeline_.reset();
  }

  // One step as the planner profiles it: its time in parts and its memory.
  struct StepMeasurement {
    double step_ms = 0, forward_backward_ms = 0, optimizer_ms = 0;
    int64_t peak_bytes = -1;       // the arena's peak (with a budget)
    int64_t forward_backward_peak_bytes = -1;  // its peak to the end of the last backward
    int64_t optimizer_peak_bytes = -1;  // its peak from the gradients' averaging to the step's end
    int64_t in_use_before = 0;     // the arena's bytes in use when the step began
  };
  StepMeasurement measure_step();
  // The planner's prediction for this run (launcher/planning/run_check.h), recorded beside what
  // each step measures.
  void set_prediction(int64_t peak_bytes, double step_ms) {
    predicted_peak_bytes_ = peak_bytes;
    predicted_step_ms_ = step_ms;
  }

  int64_t total_steps() const { return total_steps_; }
  int64_t steps_per_epoch() const { return sampler_.batches_per_epoch(); }
  const TrainerState& state() const { return state_; }
  Model& model() { return *model_; }
  const MemoryManager& memory() const { return memory_; }
  MemoryManager& memory() { return memory_; }
  Interpreter& interpreter() { return interp_; }
  // This rank's pipeline stage; null without pipeline parallelism.
  const PipelineStage* pipeline() const { return pipeline_.get(); }
  // This rank's tensor-parallel group; null without tensor parallelism.
  TensorGroup* tensor_group() { return tensor_.get(); }

 private:
  struct StepResult {
    double loss = 0, grad_norm = 0, lr = 0, ms = 0;
    double forward_backward_ms = 0, optimizer_ms = 0;  // parts of ms
    bool skipped = false;  // fp16: a gradient was not finite
    int64_t mem_peak_bytes = -1;        // the step's: the larger of its two phases
    int64_t forward_backward_peak_bytes = -1;  // to the end of the last micro-batch's backward
    int64_t optimizer_peak_bytes = -1;  // from the gradients' averaging on: the optimizer's working memory
    // The memory manager during this step.
    int64_t evictions = 0, recomputations = 0;
    double recompute_ms = 0, fragmentation = 0;
    // Host swap during this step: bytes each way, compute's waiting, bytes in that were back
    // before their read (hidden), and the host memory's peak.
    int64_t swap_out_bytes = 0, swap_in_bytes = 0, swap_in_hidden_bytes = 0, host_peak_bytes = 0;
    double swap_wait_ms = 0;
    // memory.optimizer_state = "host": the optimizer state's bytes each way and the step's wait.
    int64_t state_out_bytes = 0, state_in_bytes = 0;
    double state_wait_ms = 0;
    DataParallelStats comm;
    ShardStats shard;  // parallel.shard: the all-gather of the updated parameters
    // Tensor parallelism: bytes this rank handed its group's collectives this step, and of them
    // those that recomputations repeated (a collective's output evicted and made again).
    int64_t tensor_bytes = 0, tensor_recomputed_bytes = 0;
    // Per pipeline stage (pipeline parallelism): compute, waiting, bytes sent, memory peak.
    std::vector<double> stage_compute_ms, stage_wait_ms, stage_p2p_bytes, stage_peak_bytes;
    // Per data-parallel replica, on logged steps: the step, forward and backward, waiting for the
    // all-reduce after backward, the optimizer, the memory peak (a slow rank shows as the others'
    // waiting).
    std::vector<double> rank_step_ms, rank_compute_ms, rank_wait_ms, rank_optimizer_ms, rank_peak_bytes;
  };
  MemoryOptions memory_options() const;
  // The parameters and buffers into one block per dtype (under a budget, and with sharding: then
  // the parameters in DataParallel's reduction order first, each bucket one span).
  void compact_parameters(bool in_reduction_order);
  void set_up_sharding();
  void overlap_reduce_scatters();
  // parallel.shard = "parameters": each rank keeps its share of each bucket; the rest of the
  // state (buffers, parameters without gradients) into one block as compact_parameters puts it.
  void shard_parameters();
  // The optimizer step's checks when each rank holds its share of the gradients: the global norm
  // (the ranks' sums of squares, summed) and every rank's finite check.
  StepAcrossStages shard_step_hooks();
  // The optimizer step's checks across a tensor-parallel group (and the pipeline's stages): the
  // norm over every rank's parts of the split parameters and one copy of the replicated ones.
  StepAcrossStages tensor_step_hooks();
  // Runs fn with the split parameters and their optimizer state whole on every rank of the
  // tensor-parallel group (gathered), then keeps this rank's parts again: what a whole checkpoint
  // (model.pt) is read into.
  void with_whole_tensors(const std::function<void()>& fn);
  // What optimizer_ keeps state for: the parameters, or this rank's pieces of them (sharded).
  // Whether a sliced checkpoint's writer of whole tensors (each stage's first replica) writes
  // model parameter `index`: not another stage's, nor a tied weight's copy.
  bool writes_whole_parameter(size_t index, const at::Tensor& param) const;
  const std::vector<at::Tensor>& state_params() const { return shard_ ? shard_->pieces() : params_; }
  // Checkpoints as slices (trainer_slices.cpp): where parameter `name`, a rank's tensor of
  // `sizes`, lies in the whole tensor a checkpoint records.
  struct CheckpointPart {
    SlicePart part;              // whole: the rank holds all of it
    std::vector<int64_t> sizes;  // the whole tensor's
    int64_t valid = 0;           // elements of the rank's tensor that are the whole's (the rest: padding)
    bool writer = true;          // this rank writes it (a replicated tensor: the group's first rank)
  };
  CheckpointPart checkpoint_part(const std::string& name, const std::vector<int64_t>& sizes) const;
  // Elements [offset, offset + values.numel()) of `param`'s memory order, as a slice of its whole.
  void add_slice(SliceFileWriter& out, const std::string& kind, const std::string& name, const at::Tensor& param,
                 int64_t offset, const at::Tensor& values) const;
  // Elements [offset, offset + length) of `param`'s memory order from the checkpoint (padding: zeros).
  at::Tensor read_slice(const SliceIndex& index, const std::string& kind, const std::string& name,
                        const at::Tensor& param, int64_t offset, int64_t length) const;
  std::vector<at::Tensor> read_slice_state(const SliceIndex& index, const std::string& name, const at::Tensor& param,
                                           int64_t offset, const at::Tensor& like) const;
  void save_sliced_checkpoint();
  void write_pieces(SliceFileWriter& out, bool adamw) const;
  void write_parameters(SliceFileWriter& out, bool adamw) const;
  void write_state(SliceFileWriter& out, const std::string& name, const at::Tensor& param, int64_t offset,
                   const std::vector<at::Tensor>& state, bool adamw) const;
  void resume_from_slices(const std::string& folder);
  void read_whole_tensors_from_slices(const SliceIndex& index, const std::string& folder);
  void read_pieces_from_slices(const SliceIndex& index);
  void read_state_from_slices(const SliceIndex& index);
  // Each parameter's name, by its TensorImpl.
  std::map<const void*, std::string> parameter_names() const;
  // DataParallel's bucketed parameters (those the shards split), by TensorImpl.
  std::set<const void*> bucketed_parameters() const;
  // The rank's device memory, host data excluded: with a budget the arena's (rounding included),
  // without one on the CPU what the job counts as device memory (DeviceMemoryScope), on a GPU the
  // caching allocator's bytes in tensors, not its cache nor cuBLAS's. -1: not measured.
  int64_t device_peak_bytes() const;
  void reset_device_peak();
  void trace_step_begins();
  void trace_step_ended();
  StepResult train_step();
  double forward_backward(const Batch& micro, double loss_scale, bool last);
  double pipeline_step(const Batch& batch, StepResult& r);
  void gather_stage_stats(StepResult& r);
  void gather_replica_stats(StepResult& r);  // a collective of the replicas: every one calls it
  bool writes_outputs() const;  // rank 0 of the job
  bool eval_due() const;
  void log_step(const StepResult& r);
  void log_eval(const EvalResult& e);
  // metrics.time_by_op: the step's kernel times by op, added up after the warm-up steps; at the
  // end, a "time_by_op" record and a log line (trainer_records.cpp).
  void add_time_by_op();
  void log_time_by_op();
  // The ranks' sums of an evaluation combined into its result (a collective with several ranks).
  EvalResult finish_evaluation(double loss_sum, int64_t correct, int64_t samples, double seconds);
  void save_checkpoint();
  // The signal any rank of the job received (stop_signals.h), agreed by all: 0 to go on.
  int agreed_stop_signal();

  const Config& config_;
  DataSplits data_;
  std::shared_ptr<Model> model_;
  std::vector<at::Tensor> params_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  Sampler sampler_;
  std::unique_ptr<PipelineStage> pipeline_;
  std::shared_ptr<CpuArena> arena_;
  bool state_compacted_ = false;  // the optimizer state moved into one block (compact_optimizer_state)
  // memory.optimizer_state = "host": the state on host but for the optimizer's step; null otherwise.
  std::unique_ptr<StateOffload> state_offload_;
  std::shared_ptr<HostLink> host_link_;  // host swap's link; null without it
  std::unique_ptr<MemoryTimeline> timeline_;  // config.memory.trace
  std::unique_ptr<GradientBuffer> gradients_;  // with a budget, or with replicas
  std::unique_ptr<OptimizerShard> shard_;      // parallel.shard with more than one replica
  std::unique_ptr<GradientShards> grad_shards_;  // parallel.shard = "gradients": instead of gradients_
  // parallel.shard = "parameters" with parallel.prefetch: the thread that runs the group's
  // collectives while a step runs (gathers ahead of use, and the reduce-scatters in their turn).
  std::shared_ptr<CollectiveWorker> collectives_;
  std::unique_ptr<ParameterShards> param_shards_;  // parallel.shard = "parameters"
  std::unique_ptr<LossScaler> scaler_;         // fp16
  std::unique_ptr<TensorGroup> tensor_;  // parallel.tensor_parallel > 1
  DataParallel replicas_;
  MemoryManager memory_;  // before interp_: it outlives the interpreter's records
  OpTimeLog op_times_;    // metrics.time_by_op: the interpreter's kernels (set_op_time_log)
  std::map<std::string, double> op_ms_;  // their sums over the measured steps
  int64_t op_steps_ = 0, op_first_step_ = 0;
  Interpreter interp_;
  CheckpointStore checkpoints_;
  RunOutput* output_ = nullptr;  // during run()
  at::Device device_;
  int64_t total_steps_;
  Progress progress_;
  TrainerState state_;
  TrainResult result_;
  int64_t predicted_peak_bytes_ = -1;  // -1: no prediction
  // On a GPU without a budget: cuBLAS's workspaces, which the caching allocator counts and the
  // measured peak leaves out (make_cuda_library_workspaces).
  int64_t library_workspace_bytes_ = 0;
  double predicted_step_ms_ = 0;
};

}  // namespace ht

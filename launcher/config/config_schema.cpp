#include "launcher/config/config_schema.h"

#include <iomanip>
#include <sstream>

namespace ht {
namespace {

template <typename T> constexpr ValueType value_type_of();
template <> constexpr ValueType value_type_of<int64_t>() { return ValueType::kInt; }
template <> constexpr ValueType value_type_of<double>() { return ValueType::kFloat; }
template <> constexpr ValueType value_type_of<bool>() { return ValueType::kBool; }
template <> constexpr ValueType value_type_of<std::string>() { return ValueType::kString; }
template <> constexpr ValueType value_type_of<std::vector<int64_t>>() { return ValueType::kIntList; }

// Builds a FieldSpec from member pointers, so reading and writing the struct cannot disagree
// with the declared type. An enum with a name table (base/choice.h) is written as its name, and
// its names are the field's choices: the loader checks them before `set` parses one.
class Field {
 public:
  template <typename Section, typename T>
  Field(Section Config::*section_member, T Section::*member, const char* section, const char* key,
        const char* doc) {
    spec_.section = section;
    spec_.key = key;
    spec_.doc = doc;
    if constexpr (is_choice<T>::value) {
      spec_.type = ValueType::kString;
      spec_.choices = choice_names<T>();
      spec_.set = [=](Config& c, const ConfigValue& v) {
        (c.*section_member).*member = *parse_choice<T>(std::get<std::string>(v));
      };
      spec_.get = [=](const Config& c) { return ConfigValue(std::string(choice_name((c.*section_member).*member))); };
    } else {
      spec_.type = value_type_of<T>();
      spec_.set = [=](Config& c, const ConfigValue& v) { (c.*section_member).*member = std::get<T>(v); };
      spec_.get = [=](const Config& c) { return ConfigValue((c.*section_member).*member); };
    }
  }
  Field& min(double v) { spec_.min = v; return *this; }
  Field& max(double v) { spec_.max = v; return *this; }
  Field& required() { spec_.required = true; return *this; }
  Field& only_for_models(const std::vector<ModelKind>& models) {
    std::string words;
    for (ModelKind m : models) words += (words.empty() ? "" : " or ") + std::string(choice_name(m));
    return only_when("model.name = " + words, [models](const Config& c) {
      for (ModelKind m : models)
        if (c.model.name == m) return true;
      return false;
    });
  }
  Field& only_when(std::string words, std::function<bool(const Config&)> predicate) {
    spec_.applies_when = std::move(words);
    spec_.applies = std::move(predicate);
    return *this;
  }
  Field& not_built(const char* what) { spec_.not_built = what; return *this; }
  operator FieldSpec() const { return spec_; }  // NOLINT: the builder's purpose

 private:
  FieldSpec spec_;
};

bool uses_images(const Config& c) { return takes_images(c.model.name); }

using C = Config;

void add_job_fields(std::vector<FieldSpec>& f) {
  f.push_back(Field(&C::job, &JobConfig::name, "job", "name", "name of the run, in logs and the summary"));
  f.push_back(Field(&C::job, &JobConfig::seed, "job", "seed",
                    "seed of initialization, data order, dropout and dynamic-graph choices").min(0));
  f.push_back(Field(&C::job, &JobConfig::output_dir, "job", "output_dir",
                    "folder for config.resolved.toml, metrics.jsonl, summary.json and checkpoints"));
}

void add_model_fields(std::vector<FieldSpec>& f) {
  f.push_back(Field(&C::model, &ModelConfig::name, "model", "name", "which model to train")
                  .required());
  f.push_back(Field(&C::model, &ModelConfig::hidden, "model", "hidden", "hidden layer widths")
                  .min(1).only_for_models({ModelKind::kMlp}));
  f.push_back(Field(&C::model, &ModelConfig::channels, "model", "channels",
                    "channels of each conv block (each halves the resolution)")
                  .min(1).only_for_models({ModelKind::kConvnet}));
  f.push_back(Field(&C::model, &ModelConfig::fc_hidden, "model", "fc_hidden", "width of the classifier's hidden layer")
                  .min(1).only_for_models({ModelKind::kConvnet}));
  f.push_back(Field(&C::model, &ModelConfig::depth, "model", "depth", "18 and 34 use BasicBlock, 50 Bottleneck")
                  .min(18).max(50).only_for_models({ModelKind::kResnet}));
  f.push_back(Field(&C::model, &ModelConfig::width, "model", "width",
                    "channels of the first stage (resnet, doubled per stage) or of every block (supernet)")
                  .min(1).only_for_models({ModelKind::kResnet, ModelKind::kSupernet}));
  f.push_back(Field(&C::model, &ModelConfig::stage_blocks, "model", "stage_blocks",
                    "blocks per stage; empty: the depth's standard layout")
                  .min(1).only_for_models({ModelKind::kResnet}));
  f.push_back(Field(&C::model, &ModelConfig::small_input, "model", "small_input",
                    "3x3 stride-1 stem for small images; false: ImageNet's 7x7 stride-2 stem and max pool")
                  .only_for_models({ModelKind::kResnet}));
  const std::vector<ModelKind> decoders{ModelKind::kGpt, ModelKind::kLlama};
  f.push_back(Field(&C::model, &ModelConfig::n_layer, "model", "n_layer", "transformer blocks").min(1).only_for_models(decoders));
  f.push_back(Field(&C::model, &ModelConfig::n_head, "model", "n_head", "attention heads").min(1).only_for_models(decoders));
  f.push_back(Field(&C::model, &ModelConfig::n_embd, "model", "n_embd", "embedding width").min(1).only_for_models(decoders));
  f.push_back(Field(&C::model, &ModelConfig::block_size, "model", "block_size", "sequence length (tokens per sample)")
                  .min(1).only_for_models(decoders));
  f.push_back(Field(&C::model, &ModelConfig::vocab_size, "model", "vocab_size",
                    "token ids the embedding holds; 0: the data's vocabulary (larger: padded, as GPT-2's 50304)")
                  .min(0).only_for_models(decoders));
  f.push_back(Field(&C::model, &ModelConfig::n_kv_heads, "model", "n_kv_heads",
                    "key/value heads (grouped-query attention), dividing n_head; 0: n_head")
                  .min(0).only_for_models({ModelKind::kLlama}));
  f.push_back(Field(&C::model, &ModelConfig::ffn_dim_multiplier, "model", "ffn_dim_multiplier",
                    "SwiGLU width: 2/3 of 4 x n_embd times this (Llama 3: 1.3); 0: none")
                  .min(0).only_for_models({ModelKind::kLlama}));
  f.push_back(Field(&C::model, &ModelConfig::multiple_of, "model", "multiple_of",
                    "SwiGLU width rounded up to a multiple of this (Llama 3 8B: 1024)")
                  .min(1).only_for_models({ModelKind::kLlama}));
  f.push_back(Field(&C::model, &ModelConfig::rope_theta, "model", "rope_theta",
                    "rotary positions' base (Llama 2: 10000, Llama 3: 500000)")
                  .min(1.0001).only_for_models({ModelKind::kLlama}));
  f.push_back(Field(&C::model, &ModelConfig::norm_eps, "model", "norm_eps", "epsilon of LayerNorm (gpt) or RMSNorm (llama)")
                  .min(1e-12).only_for_models(decoders));
  f.push_back(Field(&C::model, &ModelConfig::tie_embeddings, "model", "tie_embeddings",
                    "the output head uses the token embedding's weight (gpt always does)")
                  .only_for_models({ModelKind::kLlama}));
  f.push_back(Field(&C::model, &ModelConfig::init_from, "model", "init_from",
                    "start from these weights: a Hugging Face checkpoint (a folder with model.safetensors and "
                    "config.json, e.g. one hybrid_train export wrote, or a .safetensors file) of the configured "
                    "shape; empty: random initialization")
                  .only_for_models(decoders));
  f.push_back(Field(&C::model, &ModelConfig::num_blocks, "model", "num_blocks", "choice blocks")
                  .min(1).only_for_models({ModelKind::kSupernet}));
  f.push_back(Field(&C::model, &ModelConfig::dropout, "model", "dropout", "dropout probability")
                  .min(0).max(0.99).only_for_models({ModelKind::kMlp, ModelKind::kConvnet, ModelKind::kGpt, ModelKind::kLlama}));
}

void add_data_fields(std::vector<FieldSpec>& f) {
  f.push_back(Field(&C::data, &DataConfig::dataset, "data", "dataset",
                    "fashion_mnist (idx files), synthetic (generated, learnable), text (characters of a file, or its "
                    "SentencePiece tokens), tokens (token files: llm.c's .bin shards or headerless uint16/uint32, "
                    "memory-mapped)")
                  .required());
  f.push_back(Field(&C::data, &DataConfig::path, "data", "path",
                    "fashion_mnist: folder of the idx files (default: Debian's); text: the file, or a glob or folder of files joined in path order; tokens: a file or a "
                    "glob of shards, e.g. \"data/fineweb_train_*.bin\" (sorted)")
                  .only_when("data.dataset = fashion_mnist, text or tokens",
                             [](const Config& c) { return c.data.dataset != DatasetKind::kSynthetic; }));
  auto token_files = [](const Config& c) { return c.data.dataset == DatasetKind::kTokens; };
  f.push_back(Field(&C::data, &DataConfig::eval_path, "data", "eval_path",
                    "tokens: a file or glob of the held-out split; empty: the last eval_fraction of the windows")
                  .only_when("data.dataset = tokens", token_files));
  f.push_back(Field(&C::data, &DataConfig::eval_fraction, "data", "eval_fraction",
                    "share of the text (or of the token windows) held out for evaluation")
                  .min(0.001).max(0.5)
                  .only_when("data.dataset = text, or tokens without data.eval_path", [](const Config& c) {
                    return c.data.dataset == DatasetKind::kText ||
                           (c.data.dataset == DatasetKind::kTokens && c.data.eval_path.empty());
                  }));
  f.push_back(Field(&C::data, &DataConfig::token_dtype, "data", "token_dtype",
                    "header (llm.c's 1024-byte header says: uint16 for magic 20240520, uint32 for 20240801), or "
                    "uint16 / uint32 for headerless files (nanoGPT's)")
                  .only_when("data.dataset = tokens", token_files));
  f.push_back(Field(&C::data, &DataConfig::vocab_size, "data", "vocab_size",
                    "tokens: ids are below this; 0: the header's (50257 for magic 20240520, 128256 for 20240801); "
                    "required for headerless files")
                  .min(0).only_when("data.dataset = tokens", token_files));
  f.push_back(Field(&C::data, &DataConfig::tokenizer, "data", "tokenizer",
                    "text: a SentencePiece model (from hybrid_train tokenize) the file is tokenized with at start; "
                    "empty: its characters. tokens: the model the files were made with, for hybrid_train sample")
                  .only_when("data.dataset = text or tokens", [](const Config& c) {
                    return c.data.dataset == DatasetKind::kText || c.data.dataset == DatasetKind::kTokens;
                  }));
  auto synthetic = [](const Config& c) { return c.data.dataset == DatasetKind::kSynthetic; };
  f.push_back(Field(&C::data, &DataConfig::synthetic_samples, "data", "synthetic_samples", "training samples")
                  .min(1).only_when("data.dataset = synthetic", synthetic));
  f.push_back(Field(&C::data, &DataConfig::synthetic_eval_samples, "data", "synthetic_eval_samples", "evaluation samples")
                  .min(1).only_when("data.dataset = synthetic", synthetic));
  f.push_back(Field(&C::data, &DataConfig::synthetic_shape, "data", "synthetic_shape", "shape of one image sample")
                  .min(1).only_when("data.dataset = synthetic and an image model",
                                    [=](const Config& c) { return synthetic(c) && uses_images(c); }));
  f.push_back(Field(&C::data, &DataConfig::synthetic_classes, "data", "synthetic_classes",
                    "classes (image models) or vocabulary size (gpt)")
                  .min(2).only_when("data.dataset = synthetic", synthetic));
  f.push_back(Field(&C::data, &DataConfig::shuffle, "data", "shuffle", "reshuffle the training set every epoch (by job.seed and epoch)"));
}

void add_training_fields(std::vector<FieldSpec>& f) {
  f.push_back(Field(&C::training, &TrainingConfig::device, "training", "device", "cpu, cuda or cuda:N"));
  f.push_back(Field(&C::training, &TrainingConfig::threads, "training", "threads",
                    "compute threads of a rank: ATen's, oneDNN's and OpenBLAS's pools; 0: the host's hardware threads "
                    "shared among its ranks, or fewer where the rank is bound to fewer CPUs or a container's CPU "
                    "quota allows fewer").min(0));
  f.push_back(Field(&C::training, &TrainingConfig::channels_last, "training", "channels_last",
                    "convolution weights, and so activations, in channels-last layout (NHWC): oneDNN's and "
                    "cuDNN's fast path for convolution, batch norm and pooling; false: NCHW. Same results up to "
                    "summation order")
                  .only_for_models({ModelKind::kConvnet, ModelKind::kResnet, ModelKind::kSupernet}));
  f.push_back(Field(&C::training, &TrainingConfig::steps, "training", "steps", "optimizer steps; 0: train for `epochs`").min(0));
  f.push_back(Field(&C::training, &TrainingConfig::epochs, "training", "epochs", "passes over the training set")
                  .min(1).only_when("training.steps = 0", [](const Config& c) { return c.training.steps == 0; }));
  f.push_back(Field(&C::training, &TrainingConfig::global_batch_size, "training", "global_batch_size",
                    "samples per optimizer step").min(1));
  f.push_back(Field(&C::training, &TrainingConfig::micro_batch_size, "training", "micro_batch_size",
                    "samples per forward/backward on one rank; global_batch_size / ranks must be a multiple; 0: "
                    "the rank's whole share of the global batch")
                  .min(0));
  f.push_back(Field(&C::training, &TrainingConfig::optimizer, "training", "optimizer", "sgd (with momentum) or adamw"));
  f.push_back(Field(&C::training, &TrainingConfig::lr, "training", "lr", "peak learning rate").min(0));
  f.push_back(Field(&C::training, &TrainingConfig::min_lr, "training", "min_lr", "learning rate at the end of the cosine")
                  .min(0).only_when("training.schedule = cosine", [](const Config& c) { return c.training.schedule == LrSchedule::kCosine; }));
  f.push_back(Field(&C::training, &TrainingConfig::schedule, "training", "schedule",
                    "learning rate after warmup: constant, or cosine decay to min_lr"));
  f.push_back(Field(&C::training, &TrainingConfig::warmup_steps, "training", "warmup_steps", "linear warmup from 0 to lr").min(0));
  auto sgd = [](const Config& c) { return c.training.optimizer == OptimizerKind::kSgd; };
  auto adamw = [](const Config& c) { return c.training.optimizer == OptimizerKind::kAdamw; };
  f.push_back(Field(&C::training, &TrainingConfig::momentum, "training", "momentum", "SGD momentum")
                  .min(0).max(0.9999).only_when("training.optimizer = sgd", sgd));
  f.push_back(Field(&C::training, &TrainingConfig::beta1, "training", "beta1", "AdamW first-moment decay")
                  .min(0).max(0.9999).only_when("training.optimizer = adamw", adamw));
  f.push_back(Field(&C::training, &TrainingConfig::beta2, "training", "beta2", "AdamW second-moment decay")
                  .min(0).max(0.99999).only_when("training.optimizer = adamw", adamw));
  f.push_back(Field(&C::training, &TrainingConfig::eps, "training", "eps", "AdamW epsilon")
                  .min(0).only_when("training.optimizer = adamw", adamw));
  f.push_back(Field(&C::training, &TrainingConfig::optimizer_state_dtype, "training", "optimizer_state_dtype",
                    "the type of AdamW's two moments: fp32, or bf16 (half their bytes: each step widens them, "
                    "updates in fp32 and rounds them back to nearest even; Megatron's --exp-avg-dtype)")
                  .only_when("training.optimizer = adamw", adamw));
  f.push_back(Field(&C::training, &TrainingConfig::weight_decay, "training", "weight_decay",
                    "L2 penalty (sgd) or decoupled weight decay (adamw)").min(0));
  f.push_back(Field(&C::training, &TrainingConfig::grad_clip, "training", "grad_clip", "clip the global gradient norm to this; 0: off").min(0));
  f.push_back(Field(&C::training, &TrainingConfig::eval_interval, "training", "eval_interval",
                    "evaluate every this many steps; 0: after each epoch and at the end").min(0));
  f.push_back(Field(&C::training, &TrainingConfig::eval_batches, "training", "eval_batches",
                    "batches per evaluation; 0: the whole evaluation split").min(0));
  f.push_back(Field(&C::training, &TrainingConfig::mixed_precision, "training", "mixed_precision",
                    "off (fp32), or bf16 or fp16 activations: matmul, linear, conv and attention in 16 bits, the "
                    "norms' and the loss's statistics and softmax in fp32, fp32 master weights and gradients; fp16 "
                    "needs CUDA and uses dynamic loss scaling"));
  auto half = [](const Config& c) { return c.training.mixed_precision != MixedPrecision::kOff; };
  f.push_back(Field(&C::training, &TrainingConfig::compute_weights, "training", "compute_weights",
                    "the 16-bit weights 16-bit ops read: kept (copies made once per optimizer step and kept, 2 "
                    "bytes per weight: no cast per micro-batch, recomputation or gradient), cast (autocast's "
                    "cast at each read, which a memory budget may drop), or auto (kept, unless a memory budget whose "
                    "policy evicts holds the memory). Under parallel.shard = \"parameters\", "
                    "kept means each bucket's shard in 16 bits, gathered where read (FSDP's mixed precision); "
                    "under \"optimizer\" or \"gradients\" over several ranks (no pipeline stages, no budget "
                    "that evicts), kept copies shard the fp32 weights with the optimizer: each rank keeps its share, "
                    "and the 16-bit copies are all-gathered once a step (Megatron's distributed optimizer; "
                    "memory.md)")
                  .only_when("training.mixed_precision = \"bf16\" or \"fp16\"", half));
  auto bf16 = [](const Config& c) { return c.training.mixed_precision == MixedPrecision::kBf16; };
  f.push_back(Field(&C::training, &TrainingConfig::gradient_dtype, "training", "gradient_dtype",
                    "the type the weights' gradients are kept, accumulated, reduced and stepped from: fp32 (4 bytes "
                    "a parameter), bf16 (2 bytes, 2/N sharded, half the bytes reduced; each micro-batch's gradient "
                    "rounded as it is added and the sums kept in bf16, so long accumulation loses low bits: ZeRO's "
                    "16-bit gradients), or auto (fp32, unless `plan` or strategy = \"auto\" chose bf16 because fp32 "
                    "did not fit a step of one micro-batch); memory.md")
                  .only_when("training.mixed_precision = \"bf16\"", bf16));
  auto fp16 = [](const Config& c) { return c.training.mixed_precision == MixedPrecision::kFp16; };
  const char* fp16_words = "training.mixed_precision = \"fp16\" (bf16 has fp32's exponent range and needs no loss scaling)";
  f.push_back(Field(&C::training, &TrainingConfig::loss_scale, "training", "loss_scale",
                    "initial loss scale; a step with an inf or NaN gradient is skipped and the scale backs off")
                  .min(1).only_when(fp16_words, fp16));
  f.push_back(Field(&C::training, &TrainingConfig::loss_scale_growth, "training", "loss_scale_growth",
                    "factor the loss scale grows by after loss_scale_growth_interval good steps")
                  .min(1).only_when(fp16_words, fp16));
  f.push_back(Field(&C::training, &TrainingConfig::loss_scale_backoff, "training", "loss_scale_backoff",
                    "factor the loss scale shrinks by after a skipped step")
                  .min(0.01).max(0.99).only_when(fp16_words, fp16));
  f.push_back(Field(&C::training, &TrainingConfig::loss_scale_growth_interval, "training", "loss_scale_growth_interval",
                    "good steps in a row before the loss scale grows").min(1).only_when(fp16_words, fp16));
}

void add_parallel_and_memory_fields(std::vector<FieldSpec>& f) {
  f.push_back(Field(&C::parallel, &ParallelConfig::strategy, "parallel", "strategy",
                    "manual: train as configured; auto: run the planner first (as `hybrid_train plan`) and train "
                    "with its fastest plan for the ranks started and this device's memory (micro-batch size, "
                    "memory policy and budget; the precision stays as configured)"));
  f.push_back(Field(&C::parallel, &ParallelConfig::data_parallel, "parallel", "data_parallel",
                    "data-parallel replicas: the ranks mpirun starts (-np N); 0: all of them")
                  .min(0));
  f.push_back(Field(&C::parallel, &ParallelConfig::pipeline_parallel, "parallel", "pipeline_parallel",
                    "pipeline stages: the model's blocks cut into this many stages on as many ranks (mpirun -np "
                    "data_parallel x pipeline_parallel); each stage's ranks are its data-parallel group")
                  .min(1));
  f.push_back(Field(&C::parallel, &ParallelConfig::tensor_parallel, "parallel", "tensor_parallel",
                    "ranks each layer of a gpt or llama model is split across (Megatron's tensor parallelism): "
                    "attention by heads, the MLP by its width, the embedding and output layer by the vocabulary "
                    "(padded to a multiple), the loss vocabulary-parallel; an all-reduce per sub-layer forward "
                    "and backward. Neighbouring ranks form a group (mpirun -np data_parallel x tensor_parallel x "
                    "pipeline_parallel), which must share a host")
                  .min(1).max(64));
  f.push_back(Field(&C::parallel, &ParallelConfig::context_parallel, "parallel", "context_parallel",
                    "ranks each sequence of a gpt or llama model is split across (context parallelism): each "
                    "holds a chunk from the front of every sequence and its mirror from the back (model.block_size "
                    "/ context_parallel tokens, balanced under causal masking), attention gathers the group's keys "
                    "and values (parallel.context_exchange), and the weights' gradients are averaged over data_parallel x "
                    "context_parallel ranks. The group sits between the tensor-parallel groups and the replicas "
                    "(mpirun -np data_parallel x context_parallel x tensor_parallel x pipeline_parallel)")
                  .min(1).max(64));
  f.push_back(Field(&C::parallel, &ParallelConfig::context_exchange, "parallel", "context_exchange",
                    "how attention's queries meet the context group's keys and values. ring: each rank's keys "
                    "and values go round the group, the next chunk's pass posted before this rank attends to "
                    "the one it holds (2 chunks of T / context_parallel held at a time, and in backward 3 of "
                    "their fp32 gradient sums, which go round the same way); all_gather: gathered whole for the attention, forward and again in backward, "
                    "whose key and value gradients are reduce-scattered (one collective each, the whole "
                    "sequence's keys and values held while it runs)")
                  .only_when("parallel.context_parallel > 1", [](const Config& c) { return c.parallel.context_parallel > 1; }));
  f.push_back(Field(&C::parallel, &ParallelConfig::sequence_parallel, "parallel", "sequence_parallel",
                    "with tensor parallelism: norms, dropouts and the residual stream hold each rank's piece of "
                    "the sequence (model.block_size / tensor_parallel positions), the all-reduces become "
                    "all-gathers and reduce-scatters (the same bytes forward; backward gathers the column-parallel "
                    "layers' inputs again, 1.5x), and no activation is stored whole on every rank of the group "
                    "(Korthikanti et al. 2022)")
                  .only_when("parallel.tensor_parallel > 1", [](const Config& c) { return c.parallel.tensor_parallel > 1; }));
  auto piped = [](const Config& c) { return c.parallel.pipeline_parallel > 1; };
  const char* piped_words = "parallel.pipeline_parallel > 1";
  f.push_back(Field(&C::parallel, &ParallelConfig::pipeline_schedule, "parallel", "pipeline_schedule",
                    "gpipe (every forward, then every backward: all micro-batches' activations held), 1f1b (one "
                    "forward, one backward: at most pipeline_parallel held), interleaved_1f1b (virtual_stages "
                    "chunks per rank: a smaller bubble for more messages), zb_h1 (zero bubble: backward split "
                    "into input and weight gradients, the latter filling the bubble)")
                  .only_when(piped_words, piped));
  f.push_back(Field(&C::parallel, &ParallelConfig::virtual_stages, "parallel", "virtual_stages",
                    "interleaved_1f1b: model chunks per rank (stage s holds chunks s, s + pp, ...)")
                  .min(1).max(16).only_when(piped_words, piped));
  f.push_back(Field(&C::parallel, &ParallelConfig::stage_blocks, "parallel", "stage_blocks",
                    "blocks per stage, in model order (one count per stage and chunk); empty: balanced by "
                    "the blocks' times (parallel.stage_costs) within each stage's memory")
                  .min(1).only_when(piped_words, piped));
  f.push_back(Field(&C::parallel, &ParallelConfig::stage_costs, "parallel", "stage_costs",
                    "the block times stages are balanced by: measured (a forward and backward of one micro-batch "
                    "timed per block on rank 0 at start, the median of three) or modeled (from the ops' shapes: "
                    "the same every run, no message, but blind to how fast each kernel really runs)")
                  .only_when(piped_words, piped));
  f.push_back(Field(&C::parallel, &ParallelConfig::pipeline_p2p, "parallel", "pipeline_p2p",
                    "how CPU ranks carry the stages' messages: auto (MPI's way: matched by tag, receives posted "
                    "ahead) or nccl_like (NCCL's way, to check on CPU what a GPU run does: each link's messages "
                    "matched in posting order and checked to be the ones expected, a send done only when its "
                    "receive is, each rank's calls one after another, the sends and receives of one step posted "
                    "in one group). On GPUs the stages always post NCCL's way")
                  .only_when(piped_words, piped));
  f.push_back(Field(&C::parallel, &ParallelConfig::bucket_mb, "parallel", "bucket_mb", "gradient all-reduce bucket size, MiB")
                  .min(1));
  f.push_back(Field(&C::parallel, &ParallelConfig::overlap, "parallel", "overlap",
                    "start each bucket's all-reduce (with parallel.shard = \"gradients\" or \"parameters\": its "
                    "reduce-scatter), on a worker thread, as soon as backward has finished its gradients; false: "
                    "all-reduce after backward, reduce-scatter where backward finishes the bucket"));
  f.push_back(Field(&C::parallel, &ParallelConfig::shard, "parallel", "shard",
                    "what the data-parallel ranks split among them, ZeRO's stages: none (each rank holds all of "
                    "the model's state), optimizer (each rank keeps and updates the optimizer state of 1/N of the "
                    "parameters; the updated parameters are all-gathered after the step, or with 16-bit copies kept "
                    "each rank keeps only its share of the fp32 weights and the copies are gathered: ZeRO-1; with "
                    "pipeline stages, within each stage's replicas), gradients (as "
                    "optimizer, and each rank keeps only its share of the summed gradients, reduce-scattered per bucket "
                    "every micro-batch: ZeRO-2; not with pipeline stages), "
                    "parameters (as gradients, and the parameters too: each block's are all-gathered where a kernel "
                    "reads them and freed after: ZeRO-3, FSDP's full sharding; not with pipeline stages, host swap, "
                    "static plans or measured kernel costs)"));
  f.push_back(Field(&C::parallel, &ParallelConfig::prefetch, "parallel", "prefetch",
                    "sharded parameters: how many blocks ahead of the one computing have their parameters "
                    "all-gathered, on a communication thread, while it computes (forward and backward; FSDP's "
                    "prefetch); 0: each bucket is gathered where it is first read. Off under a memory budget "
                    "with eviction, where the memory manager decides what stays gathered")
                  .min(0).max(8)
                  .only_when("parallel.shard = \"parameters\"",
                             [](const Config& c) { return c.parallel.shard == ShardLevel::kParameters; }));
  f.push_back(Field(&C::parallel, &ParallelConfig::timeout_s, "parallel", "timeout_s",
                    "a collective not done after this many seconds ends the job, naming the rank, the step and the "
                    "collective (another rank died or hangs)")
                  .min(1));
  // [memory]
  auto evicting = [](const Config& c) { return evicts(c.memory.policy); };
  const char* evicting_words = "memory.policy is not \"none\"";
  f.push_back(Field(&C::memory, &MemoryConfig::policy, "memory", "policy",
                    "none (never evict: the budget is a hard limit); static plans: static (a plan for each op "
                    "sequence from its first step, DTR for steps that leave it), auto (the default where "
                    "memory.budget is set on one CPU rank's step without pipeline stages or tensor parallelism: "
                    "the planner predicts none, static, full, per_block (also with memory.block_offload, each at "
                    "its fastest share), dtr (also with memory.eviction_threshold = 1.0) "
                    "and hybrid (also with the optimizer state on host) at the budget and trains the fastest "
                    "that fits; where it predicts nothing, a plan once a sequence repeats, DTR "
                    "otherwise), segments (torch's checkpoint_sequential: sqrt(n) segments of "
                    "blocks, recomputed whole); full (Megatron's full recomputation: every block but the last "
                    "keeps only its output, its other activations recomputed by DTR in its backward; with "
                    "pipeline stages and tensor parallelism too); per_block (as full, but each block keeps "
                    "what a solved plan chooses in memory.block_keep bytes); or DTR with an eviction heuristic: dtr (the "
                    "paper's h_DTR), "
                    "dtr_eq (its union-find approximation), megengine (fragmentation-aware), lru or largest; or "
                    "host swap: swap (vDNN: convolution and matmul outputs copied to host memory in forward, "
                    "prefetched in backward) or hybrid (Capuchin: swap what the link hides under forward, "
                    "recompute the rest by DTR's score)"));
  f.push_back(Field(&C::memory, &MemoryConfig::budget, "memory", "budget",
                    "device memory per rank, parameters, gradients and optimizer state included: \"1.5GiB\", "
                    "\"800MiB\", \"2GB\", bytes, or \"60%\" of the device; empty: unlimited"));
  f.push_back(Field(&C::memory, &MemoryConfig::block_keep, "memory", "block_keep",
                    "per_block: what each block keeps through forward of what its backward reads, in bytes "
                    "(\"12MiB\") or as a share of it (\"40%\"), the values chosen so that regenerating the rest "
                    "costs least (docs/memory.md), or one share per pipeline stage (\"25%,75%\": the first "
                    "stage, holding the most micro-batches in flight, keeping least; 0% its full recomputation); "
                    "empty: on one CPU rank without stages or tensor parallelism the "
                    "planner's fastest share that fits memory.budget (or full, where keeping none is fastest), "
                    "elsewhere 50%")
                  .only_when("memory.policy = \"per_block\"",
                             [](const Config& c) { return c.memory.policy == MemoryPolicy::kPerBlock; }));
  f.push_back(Field(&C::memory, &MemoryConfig::block_offload, "memory", "block_offload",
                    "per_block: each block's plan may also offload values to host memory (copied out when the "
                    "block ends, beside the next block's forward, and back before its backward), where the host "
                    "link hides the copies better than recomputation; within memory.host_budget, at "
                    "memory.host_link_gbps (on a GPU, the link's rate measured at start)")
                  .only_when("memory.policy = \"per_block\"",
                             [](const Config& c) { return c.memory.policy == MemoryPolicy::kPerBlock; }));
  f.push_back(Field(&C::memory, &MemoryConfig::eviction_threshold, "memory", "eviction_threshold",
                    "before each op, evict until its outputs fit under this share of the budget (1: the whole "
                    "budget, cheaper where it trains, but blocks that cannot be evicted may then fragment it; "
                    "swap and hybrid take at most 0.9)")
                  .min(0.1).max(1.0).only_when(evicting_words, evicting));
  f.push_back(Field(&C::memory, &MemoryConfig::sqrt_sampling, "memory", "sqrt_sampling",
                    "score sqrt(N) random candidates per eviction, not all N (the DTR paper's approximation)")
                  .only_when(evicting_words, evicting));
  f.push_back(Field(&C::memory, &MemoryConfig::ignore_small, "memory", "ignore_small",
                    "never evict tensors under 1% of the mean candidate size (the DTR paper's approximation)")
                  .only_when(evicting_words, evicting));
  f.push_back(Field(&C::memory, &MemoryConfig::eviction_window, "memory", "eviction_window",
                    "when an allocation finds no free block large enough, evict the cheapest run of adjacent "
                    "blocks that makes one (Coop's sliding window), not the policy's favourites one by one "
                    "wherever they lie; dtr, dtr_eq and megengine only")
                  .only_when(evicting_words, evicting));
  f.push_back(Field(&C::memory, &MemoryConfig::kernel_costs, "memory", "kernel_costs",
                    "what eviction takes for the cost of recomputing a tensor: modeled (from the op's shapes, "
                    "the same on every run, so a budget that trains once trains every time) or measured (the "
                    "kernel's time on this run: as noisy as the machine)")
                  .only_when(evicting_words, evicting));
  auto planning = [](const Config& c) { return plans_statically(c.memory.policy); };
  const char* planning_words = "memory.policy is static, auto or segments";
  f.push_back(Field(&C::memory, &MemoryConfig::solve_time_s, "memory", "solve_time_s",
                    "time limit of the solver for one static plan (the segments heuristic answers when it runs out); "
                    "0: the heuristic alone, weighing memory.kernel_costs, so that a step gets the same plan on every run")
                  .min(0).only_when(planning_words, planning));
  f.push_back(Field(&C::memory, &MemoryConfig::static_layout, "memory", "static_layout",
                    "place every block of a planned step at an offset laid out ahead of time, so that it cannot "
                    "fragment; false: the arena's own placement")
                  .only_when(planning_words, planning));
  f.push_back(Field(&C::memory, &MemoryConfig::plan_first_step, "memory", "plan_first_step",
                    "plan the first step before it runs, from the job's micro-batch traced on meta tensors, so "
                    "that it runs on a plan rather than under DTR (a budget DTR cannot train a first step in may "
                    "train so); false: the first step runs under DTR and the plan is made from it. One rank's "
                    "whole model only (no pipeline stages, tensor parallelism or sharded parameters)")
                  .only_when(planning_words, planning));
  auto swapping = [](const Config& c) {
    return uses_host_link(c.memory.policy, c.memory.block_offload) || c.memory.policy == MemoryPolicy::kAuto;
  };
  const char* swapping_words = "memory.policy is swap, hybrid or auto, or per_block with memory.block_offload";
  f.push_back(Field(&C::memory, &MemoryConfig::host_budget, "memory", "host_budget",
                    "host memory for swapped activations: bytes with a unit (\"8GiB\") or a share of the host's "
                    "available memory (\"50%\"); empty: half of it. A copy that would pass it is not made (the "
                    "tensor is recomputed instead)")
                  .only_when(swapping_words, swapping));
  f.push_back(Field(&C::memory, &MemoryConfig::host_link_gbps, "memory", "host_link_gbps",
                    "GB/s of the link between device and host memory, each way (PCIe Gen4 x16 gives about 25 "
                    "in practice); on CPU ranks copies take the time this link would take. On a GPU the copies "
                    "run on copy streams at the link's own rate, measured at start, and the planner prices them "
                    "at it")
                  .min(0.01).only_when(swapping_words, swapping));
  f.push_back(Field(&C::memory, &MemoryConfig::compress, "memory", "compress",
                    "what backward keeps, smaller: off; lossless (relu keeps a 1-bit mask of where it was positive "
                    "instead of its output; the same bits as off); bf16 (lossless, and fp32 activations cross the "
                    "host link and wait on host as bf16: half the bytes, changes bits; needs memory.policy swap or "
                    "hybrid)"));
  f.push_back(Field(&C::memory, &MemoryConfig::optimizer_state, "memory", "optimizer_state",
                    "where the optimizer state waits between optimizer steps: device; or host (ZeRO-Offload's "
                    "place: copied over the host link after each step and back before the next, so forward and "
                    "backward have its bytes for activations; the same bits; needs memory.policy swap or hybrid)"));
  f.push_back(Field(&C::memory, &MemoryConfig::trace, "memory", "trace",
                    "write <job.output_dir>/memory_trace.json: kernels, recomputations, evictions, allocations "
                    "and bytes in use, for chrome://tracing or Perfetto"));
  f.push_back(Field(&C::memory, &MemoryConfig::trace_steps, "memory", "trace_steps", "steps the memory trace covers")
                  .min(1).only_when("memory.trace = true", [](const Config& c) { return c.memory.trace; }));
  f.push_back(Field(&C::memory, &MemoryConfig::check_fit, "memory", "check_fit",
                    "before the first step, predict this run's peak from a profiled step and refuse the run if it "
                    "cannot fit (naming plans that do); false: train anyway, and stop at the first out-of-memory"));
  f.push_back(Field(&C::memory, &MemoryConfig::host_cache, "memory", "host_cache",
                    "keep freed CPU memory in the process for the next step, as a GPU caching allocator does "
                    "(no page faults; free blocks beyond max(64 MiB, bytes in use) are returned); false: return "
                    "it to the system (malloc). Changes no result"));
}

void add_cluster_fields(std::vector<FieldSpec>& f) {
  auto described = [](const Config& c) { return c.cluster.nodes > 0; };
  auto on_gpus = [](const Config& c) { return c.cluster.nodes > 0 && !c.cluster.device.empty(); };
  const char* words = "cluster.nodes > 0";
  f.push_back(Field(&C::cluster, &ClusterConfig::nodes, "cluster", "nodes",
                    "nodes of the machine `hybrid_train plan` plans for; 0: this machine, measured")
                  .min(0));
  f.push_back(Field(&C::cluster, &ClusterConfig::device, "cluster", "device",
                    "a device kind of the catalog (configs/devices.toml), e.g. \"h100-sxm\": plan from a step traced "
                    "on meta tensors, priced at its rates (memory and links stay this table's keys; `plan --cluster` "
                    "sets them all); \"\": profile the model here and scale by device_speed").only_when(words, described));
  f.push_back(Field(&C::cluster, &ClusterConfig::devices_per_node, "cluster", "devices_per_node",
                    "devices (ranks) per node").min(1).only_when(words, described));
  f.push_back(Field(&C::cluster, &ClusterConfig::device_memory, "cluster", "device_memory",
                    "memory of one device, e.g. \"80GiB\"").only_when(words, described));
  f.push_back(Field(&C::cluster, &ClusterConfig::host_memory, "cluster", "host_memory",
                    "host memory of one node, e.g. \"2TiB\", shared by its devices' ranks: what per_block's "
                    "offload to host may fill (half of a rank's share, at memory.host_link_gbps); \"\": not "
                    "described, and the search offers no offload (on a GPU at hand, `plan` and the run check "
                    "take this machine's)").only_when(words, described));
  f.push_back(Field(&C::cluster, &ClusterConfig::intra_node_gbps, "cluster", "intra_node_gbps",
                    "GB/s between devices of a node (all-reduce bus bandwidth)").min(0.001).only_when(words, described));
  f.push_back(Field(&C::cluster, &ClusterConfig::inter_node_gbps, "cluster", "inter_node_gbps",
                    "GB/s between nodes").min(0.001).only_when(words, described));
  f.push_back(Field(&C::cluster, &ClusterConfig::intra_node_latency_us, "cluster", "intra_node_latency_us",
                    "latency of one message within a node, microseconds").min(0).only_when(words, described));
  f.push_back(Field(&C::cluster, &ClusterConfig::inter_node_latency_us, "cluster", "inter_node_latency_us",
                    "latency of one message between nodes, microseconds").min(0).only_when(words, described));
  f.push_back(Field(&C::cluster, &ClusterConfig::device_speed, "cluster", "device_speed",
                    "compute speed of one device relative to the one `plan` profiles on (e.g. 40 for a GPU "
                    "against this CPU)").min(1e-6).only_when(words, described));
  f.push_back(Field(&C::cluster, &ClusterConfig::runtime_mib, "cluster", "runtime_mib",
                    "MiB of each device a rank's process holds outside its tensors: the CUDA context with "
                    "libtorch's kernels, handles and workspaces (about 300 MiB of context with lazy loading, "
                    "pytorch/pytorch#107667; a PyTorch process about 1 GB, #28394)").min(0).only_when("cluster.device is set", on_gpus));
  f.push_back(Field(&C::cluster, &ClusterConfig::communicator_mib, "cluster", "communicator_mib",
                    "MiB of each device one NCCL communicator holds (a rank has one per group it is in: "
                    "data-parallel, tensor-parallel, pipeline; 544-688 MB measured on A100s with NVLink, "
                    "NVIDIA/nccl#964; more channels, so more memory, at H100's bandwidth, #986)")
                  .min(0).only_when("cluster.device is set", on_gpus));
}

void add_checkpoint_and_metrics_fields(std::vector<FieldSpec>& f) {
  auto checkpointing = [](const Config& c) { return c.checkpoint.interval > 0 || !c.checkpoint.resume.empty(); };
  f.push_back(Field(&C::checkpoint, &CheckpointConfig::interval, "checkpoint", "interval",
                    "save every this many steps (and at the end); 0: never").min(0));
  f.push_back(Field(&C::checkpoint, &CheckpointConfig::keep, "checkpoint", "keep", "checkpoints to keep (the newest)")
                  .min(1).only_when("checkpoint.interval > 0",
                                    [](const Config& c) { return c.checkpoint.interval > 0; }));
  f.push_back(Field(&C::checkpoint, &CheckpointConfig::async, "checkpoint", "async",
                    "copy the checkpoint to host memory at its step and write it on a thread of its own while "
                    "training goes on; published (renamed into place, \"latest\") only once every rank's files are "
                    "on disk; one write at a time (docs/running.md)")
                  .only_when("checkpoint.interval > 0",
                             [](const Config& c) { return c.checkpoint.interval > 0; }));
  f.push_back(Field(&C::checkpoint, &CheckpointConfig::resume, "checkpoint", "resume",
                    "\"latest\" (newest valid checkpoint, if any) or a checkpoint's folder; empty: start afresh"));
  f.push_back(Field(&C::checkpoint, &CheckpointConfig::dir, "checkpoint", "dir", "checkpoint folder; empty: <job.output_dir>/checkpoints")
                  .only_when("checkpointing (interval > 0 or resume)", checkpointing));
  // [metrics]
  f.push_back(Field(&C::metrics, &MetricsConfig::log_interval, "metrics", "log_interval",
                    "steps between metrics.jsonl records and log lines").min(1));
  f.push_back(Field(&C::metrics, &MetricsConfig::time_by_op, "metrics", "time_by_op",
                    "time every kernel (CUDA events on a GPU) and log where each step's time goes, by op, "
                    "beside the planner's prediction (a \"time_by_op\" record at the end; "
                    "scripts/compare_plan_run.py)")
                  .only_when("parallel.pipeline_parallel = 1",
                             [](const Config& c) { return c.parallel.pipeline_parallel == 1; }));
}

std::vector<FieldSpec> build_schema() {
  std::vector<FieldSpec> f;
  add_job_fields(f);
  add_model_fields(f);
  add_data_fields(f);
  add_training_fields(f);
  add_parallel_and_memory_fields(f);
  add_cluster_fields(f);
  add_checkpoint_and_metrics_fields(f);
  return f;
}

}  // namespace

const std::vector<FieldSpec>& config_schema() {
  static const std::vector<FieldSpec> schema = build_schema();
  return schema;
}

const std::vector<std::string>& config_sections() {
  static const std::vector<std::string> sections{"job", "model", "data", "training",
                                                 "parallel", "memory", "cluster", "checkpoint", "metrics"};
  return sections;
}

const FieldSpec* find_field(const std::string& section, const std::string& key) {
  for (const FieldSpec& f : config_schema())
    if (f.section == section && f.key == key) return &f;
  return nullptr;
}

std::string type_name(ValueType type) {
  switch (type) {
    case ValueType::kInt: return "integer";
    case ValueType::kFloat: return "number";
    case ValueType::kBool: return "boolean";
    case ValueType::kString: return "string";
    case ValueType::kIntList: return "list of integers";
  }
  return "?";
}

std::string limit_text(const FieldSpec& field, double limit) {
  if (field.type == ValueType::kFloat) return to_toml(limit);
  return std::to_string(static_cast<int64_t>(limit));
}

std::string to_toml(const ConfigValue& value) {
  struct Render {
    std::string operator()(int64_t v) const { return std::to_string(v); }
    std::string operator()(double v) const {
      std::ostringstream out;
      out << std::setprecision(15) << v;
      std::string s = out.str();
      if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // stays a TOML float
      return s;
    }
    std::string operator()(bool v) const { return v ? "true" : "false"; }
    std::string operator()(const std::string& v) const {
      std::string out = "\"";
      for (char ch : v) {
        if (ch == '"' || ch == '\\') out += '\\';
        out += ch;
      }
      return out + "\"";
    }
    std::string operator()(const std::vector<int64_t>& v) const {
      std::string out = "[";
      for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
      return out + "]";
    }
  };
  return std::visit(Render{}, value);
}

}  // namespace ht

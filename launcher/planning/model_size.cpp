#include "launcher/planning/model_size.h"

#include "alloc/byte_size.h"
#include "alloc/cuda_arena.h"
#include "launcher/model_factory.h"
#include "launcher/planning/meta_trace.h"
#include "runtime/kernel_workspace.h"
#include "base/user_error.h"

#include <ATen/Context.h>

#include <cstdio>
#include <optional>

namespace ht {
namespace {

// Bytes of optimizer state per parameter: AdamW's two moments (in training.optimizer_state_dtype),
// SGD's momentum buffer.
int64_t optimizer_bytes_per_parameter(const TrainingConfig& t) {
  if (t.optimizer == OptimizerKind::kAdamw) return t.optimizer_state_dtype == StateDtype::kBf16 ? 4 : 8;
  return t.momentum > 0 ? 4 : 0;
}

std::string billions(int64_t parameters) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2fB", static_cast<double>(parameters) / 1e9);
  return buf;
}

// What one rank may hold, and where that limit comes from (for the message).
int64_t rank_limit(const Config& c, const RankShare& rank, int ranks_on_host, std::string& where) {
  const at::Device device(rank.device);
  if (rank.budget_bytes > 0) {
    where = "memory.budget = \"" + c.memory.budget + "\"";
    return rank.budget_bytes;
  }
  if (device.is_cuda()) {
    where = "the GPU's memory";
    return cuda_device_memory_bytes(device.has_index() ? device.index() : 0);
  }
  where = ranks_on_host > 1 ? "this host's available memory shared by " + std::to_string(ranks_on_host) + " ranks"
                            : "this host's available memory";
  return host_available_memory_bytes() / std::max(ranks_on_host, 1);
}

}  // namespace

std::optional<ModelStateSize> model_state_from_shape(const Config& c, int64_t data_vocab) {
  if (!is_decoder(c.model.name)) return std::nullopt;
  const DecoderOptions shape = decoder_options(c.model, data_vocab);
  ModelStateSize s;
  s.parameters = shape.parameter_count();
  s.bytes = s.parameters * (4 + 4 + optimizer_bytes_per_parameter(c.training));
  return s;
}

int64_t state_bytes_per_rank(const Config& c, const ModelStateSize& state, int replicas) {
  if (c.parallel.shard == ShardLevel::kNone || replicas <= 1) return state.bytes;
  // The optimizer's state, at "gradients" the fp32 gradients too, and at "parameters" the fp32
  // parameters as well, split over the replicas.
  const int64_t split = state.parameters * (optimizer_bytes_per_parameter(c.training) +
                                            (c.parallel.shard >= ShardLevel::kGradients ? 4 : 0) +
                                            (c.parallel.shard >= ShardLevel::kParameters ? 4 : 0));
  return state.bytes - split + (split + replicas - 1) / replicas;
}

void refuse_a_model_too_large_here(const Config& c, const RankShare& rank, int64_t data_vocab, int ranks_on_host,
                                   const char* command) {
  const int replicas = rank.replicas;
  std::optional<ModelStateSize> state = model_state_from_shape(c, data_vocab);
  if (!state) return;
  const int64_t whole = state->bytes;
  const auto t = static_cast<int>(c.parallel.tensor_parallel);
  state->bytes = state_bytes_per_rank(c, *state, replicas);  // what one rank holds
  std::string where;
  const int64_t limit = rank_limit(c, rank, ranks_on_host, where);
  const int stages = static_cast<int>(c.parallel.pipeline_parallel);
  // A tensor-parallel rank holds about 1/t (its parts, and the norms whole).
  const int64_t rank_estimate = state->bytes / stages / t;
  if (limit <= 0 || rank_estimate + rank_estimate / 50 <= limit) return;
  // Traced on meta (launcher/planning/meta_trace.h): the rank's part exactly, and what one
  // micro-batch adds at its peak. In no memory, in about a second for a 70B shape.
  const DataInfo info{Task::kLanguageModel, {c.model.block_size}, data_vocab, "tokens", 0};
  std::optional<TracedStep> traced;
  try {
    const DeclaredWorkspaces declared(WorkspaceRules::kThisCpu);  // this machine's kernels
    traced = trace_micro_batch(c, info, rank.micro_batch);
  } catch (const std::exception&) {
    // No address space for the trace (a ulimit -v): refused on the shape's count alone.
  }
  ModelStateSize part = *state;
  if (traced) part.parameters = traced->parameters;
  part.bytes = part.parameters * (whole / state->parameters);
  const int64_t rank_state = state_bytes_per_rank(c, part, replicas) / stages;
  if (rank_state <= limit) return;
  std::string per_rank;  // what a rank holds, where that is less than the whole
  if (rank_state < whole) {
    per_rank = " (" + format_bytes(rank_state) + " a rank";
    if (t > 1) {
      per_rank += " with parallel.tensor_parallel = " + std::to_string(t) + ", its part " + billions(part.parameters) +
                  " parameters";
    }
    if (c.parallel.shard != ShardLevel::kNone && replicas > 1) {
      per_rank += std::string(t > 1 ? "," : "") + " with parallel.shard = \"" + choice_name(c.parallel.shard) +
                  "\" over " + std::to_string(replicas) + " ranks";
    }
    if (stages > 1) per_rank += ", a pipeline stage's share of it";
    per_rank += ")";
  }
  char traced_words[300] = "";
  if (traced) {
    std::snprintf(traced_words, sizeof traced_words,
                  "; traced on meta tensors (no memory, %.1f s), one micro-batch of %lld adds %s at its peak "
                  "(activations and gradients as configured, before any recomputation)",
                  traced->seconds, static_cast<long long>(rank.micro_batch),
                  format_bytes(traced->step_peak_bytes).c_str());
  }
  throw UserError(
      c.source + ": model.name = \"" + choice_name(c.model.name) + "\" at this shape has " + billions(state->parameters) +
      " parameters; with their gradients and " + choice_name(c.training.optimizer) + " state that is " +
      format_bytes(whole) + per_rank + traced_words + "; more than " + where + " (" +
      format_bytes(limit) + ") can hold, so `hybrid_train " + command +
      "` stops before building it. Give each rank less: more data-parallel ranks with parallel.shard = "
      "\"optimizer\" (each keeps 1/N of the optimizer state), tensor parallelism, pipeline stages, or GPUs with more "
      "memory; or choose a smaller shape in [model]. To plan it for a cluster, traced rather than run: `hybrid_train "
      "plan " + c.source + " --cluster h100-sxm:4x8` (any kind of configs/devices.toml; docs/how-many-gpus.md)");
}

}  // namespace ht

#include "launcher/planning/model_size.h"

#include "alloc/byte_size.h"
#include "alloc/cuda_arena.h"
#include "launcher/model_factory.h"
#include "launcher/user_error.h"

#include <ATen/Context.h>

#include <cstdio>

namespace ht {
namespace {

// Bytes of optimizer state per parameter: AdamW's two moments, SGD's momentum buffer.
int64_t optimizer_bytes_per_parameter(const TrainingConfig& t) {
  if (t.optimizer == OptimizerKind::kAdamw) return 8;
  return t.momentum > 0 ? 4 : 0;
}

std::string billions(int64_t parameters) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2fB", static_cast<double>(parameters) / 1e9);
  return buf;
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

void refuse_a_model_too_large_here(const Config& c, int64_t data_vocab, int ranks_on_host, const char* command,
                                   int replicas) {
  std::optional<ModelStateSize> state = model_state_from_shape(c, data_vocab);
  if (!state) return;
  const int64_t whole = state->bytes;
  state->bytes = state_bytes_per_rank(c, *state, replicas);  // what one rank holds
  const at::Device device(c.training.device);
  std::string where;
  int64_t limit = 0;
  if (c.memory.budget_bytes > 0) {
    limit = c.memory.budget_bytes;
    where = "memory.budget = \"" + c.memory.budget + "\"";
  } else if (device.is_cuda()) {
    limit = cuda_device_memory_bytes(device.has_index() ? device.index() : 0);
    where = "the GPU's memory";
  } else {
    limit = host_available_memory_bytes() / std::max(ranks_on_host, 1);
    where = ranks_on_host > 1 ? "this host's available memory shared by " + std::to_string(ranks_on_host) + " ranks"
                              : "this host's available memory";
  }
  if (limit <= 0 || state->bytes <= limit) return;
  const int stages = static_cast<int>(c.parallel.pipeline_parallel);
  if (stages > 1 && state->bytes / stages <= limit) return;  // each stage holds its share
  throw UserError(
      c.source + ": model.name = \"" + choice_name(c.model.name) + "\" at this shape has " + billions(state->parameters) +
      " parameters; with their gradients and " + choice_name(c.training.optimizer) + " state that is " +
      format_bytes(whole) +
      (state->bytes < whole ? " (" + format_bytes(state->bytes) + " a rank with parallel.shard = \"" +
                                  choice_name(c.parallel.shard) + "\" over " + std::to_string(replicas) + " ranks)"
                            : std::string()) +
      (stages > 1 ? " (" + format_bytes(state->bytes / stages) + " per pipeline stage)" : "") +
      ", more than " + where + " (" + format_bytes(limit) + ") can hold, so `hybrid_train " + command +
      "` stops before building it. Give each rank less: more data-parallel ranks with parallel.shard = "
      "\"optimizer\" (each keeps 1/N of the optimizer state), pipeline stages, or GPUs with more memory; or choose a "
      "smaller shape in [model]; planning a model that does not fit this machine needs a traced step (docs/status.md)");
}

}  // namespace ht

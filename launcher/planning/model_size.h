#pragma once
// Before anything large is allocated: a transformer's own state (parameters, their gradients,
// the optimizer's state) counted from its shape alone, against what one rank here can hold. An
// 8B-parameter Llama needs 128 GB of fp32 state with AdamW; building it on a 24 GB machine used
// to end in an arena's "cannot reserve" or the kernel's out-of-memory killer. Profiling (what
// `plan` and the pre-run check do today) needs the model built, so such a shape is refused here,
// with its numbers: the state, and what one micro-batch adds, from a step traced on meta tensors
// (launcher/planning/meta_trace.h; a tensor-parallel rank's part counted exactly).

#include "launcher/config/config.h"

#include <cstdint>
#include <optional>
#include <string>

namespace ht {

struct ModelStateSize {
  int64_t parameters = 0;
  int64_t bytes = 0;  // fp32 parameters and gradients, and the optimizer's state
};

// From the shape alone (decoders; nullopt for the other models, whose size needs the data's
// shape and stays small). `data_vocab`: the data's vocabulary, unless model.vocab_size is set.
std::optional<ModelStateSize> model_state_from_shape(const Config& config, int64_t data_vocab);

// One rank's share of `state`: the optimizer's state (and at "gradients" the gradients) split over
// `replicas` data-parallel ranks where parallel.shard shards it (a share rounded up), else all of it.
int64_t state_bytes_per_rank(const Config& config, const ModelStateSize& state, int replicas);

// Throws UserError (exit 2) when a rank's state cannot fit one rank: the budget if one is set,
// else the device's memory, or this host's available memory shared by `ranks_on_host` ranks.
// `replicas`: the data-parallel ranks that share sharded state. `command` says what was asked
// ("train", "plan") for the message.
// What one rank of the job holds and runs: the budget's bytes (0: none), its micro-batch, the
// data-parallel ranks that share sharded state, and its device ("cuda:N": that GPU's memory).
struct RankShare {
  int64_t budget_bytes = 0;
  int64_t micro_batch = 1;
  int replicas = 1;
  std::string device = "cpu";
};
void refuse_a_model_too_large_here(const Config& config, const RankShare& rank, int64_t data_vocab, int ranks_on_host,
                                   const char* command);

}  // namespace ht

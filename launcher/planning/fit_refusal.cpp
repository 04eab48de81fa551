#include "launcher/planning/fit_refusal.h"

#include "alloc/byte_size.h"

#include <algorithm>
#include <cstdio>

namespace ht {
namespace {

std::string ratio(double a, double b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2fx", a / b);
  return buf;
}

}  // namespace

UserError does_not_fit(const Config& c, const RunPlan& run, const Prediction& p, int64_t limit,
                       const std::vector<RankedPlan>& fitting, const std::string& auto_words) {
  const bool budget = run.memory.budget_bytes > 0;
  const std::string where = budget ? "memory.budget = \"" + c.memory.budget + "\" (" + format_bytes(limit) + ")"
                                   : "this machine's memory per rank (" + format_bytes(limit) + ")";
  const int64_t state = p.state_bytes();
  if (state >= limit) {
    return UserError(c.source + ": " + where + " cannot hold the model's parameters, gradients and " +
                     choice_name(c.training.optimizer) + " state (" + format_bytes(state) + "), before any activation; raise " +
                     (budget ? "memory.budget" : "the memory") + " above " + format_bytes(state) +
                     " or train a smaller model");
  }
  // Under eviction the replay says why (its numbers add up to the budget); without, the peak's
  // terms add up to the peak.
  std::string text;
  if (!auto_words.empty()) {
    text = c.source + ": memory.policy = \"auto\" found no policy that trains training.micro_batch_size = " +
           std::to_string(run.batch.micro) + " in " + where + " (" + auto_words + "); under static plans: " +
           (p.why_not.empty() ? "a predicted peak of " + format_bytes(p.peak_bytes) : p.why_not);
  } else if (evicts(c.memory.policy) && budget) {
    text = c.source + ": memory.policy = \"" + choice_name(c.memory.policy) + "\" cannot train in " + where + ": " +
           p.why_not;
  } else {
    text = c.source + ": predicted peak " + format_bytes(p.peak_bytes) + " per rank (model state " +
           format_bytes(state) + ", batch and sampler " + format_bytes(p.batch_bytes + p.sampler_bytes) +
           (p.optimizer_working_bytes > p.activation_bytes
                ? ", the optimizer step's temporaries " + format_bytes(p.optimizer_working_bytes)
                : ", activations " + format_bytes(p.activation_bytes)) +
           (p.peak_bytes <= limit ? ") leaves less than 3% of " + where + " free, which fragmentation takes"
                                  : ") does not fit " + where);
  }
  // Channels-last convolutions need temporaries the size of a weight, which fragment a small budget.
  const bool images = takes_images(c.model.name) && c.model.name != ModelKind::kMlp;
  const std::string layout_hint = images && c.training.channels_last
                                      ? "; near the minimum, training.channels_last = false can help"
                                      : "";
  if (fitting.empty()) {
    const char* choices = run.grid.data > 1 ? ", memory policy or sharding level" : " or memory policy";
    text += std::string("; no micro-batch size, precision") + choices + " fits at " + std::to_string(run.grid.data) +
            " rank(s): raise the memory, or add ranks (hybrid_train plan " + c.source + " shows how many)" +
            layout_hint;
    return UserError(text);
  }
  text += ". Plans that fit (step time against this one's prediction):";
  for (size_t i = 0; i < std::min<size_t>(3, fitting.size()); ++i) {
    const Plan& q = fitting[i].plan;
    const Prediction& r = fitting[i].prediction;
    text += std::string(i ? ";" : "") + " training.micro_batch_size = " + std::to_string(q.micro_batch);
    if (q.precision != c.training.mixed_precision) {
      text += std::string(", training.mixed_precision = \"") + choice_name(q.precision) + "\"";
    }
    if (evicts(q.policy)) text += std::string(", memory.policy = \"") + choice_name(q.policy) + "\"";
    if (q.policy == MemoryPolicy::kPerBlock && q.block_keep_share > 0) {
      char keep[48];
      std::snprintf(keep, sizeof keep, ", memory.block_keep = \"%.9g%%\"", 100 * q.block_keep_share);
      text += keep;
    }
    if (q.shard != c.parallel.shard) text += std::string(", parallel.shard = \"") + choice_name(q.shard) + "\"";
    if (q.shard == ShardLevel::kParameters && !evicts(q.policy) && q.prefetch != c.parallel.prefetch) {
      text += ", parallel.prefetch = " + std::to_string(q.prefetch);
    }
    text += " peaks at " + format_bytes(r.peak_bytes) + " (" + std::to_string(100 * r.peak_bytes / limit) +
            "% of it) at " + ratio(r.step_ms, p.step_ms) + " the step time";
  }
  text += "; or set parallel.strategy = \"auto\" to train the first" + layout_hint;
  return UserError(text);
}

}  // namespace ht

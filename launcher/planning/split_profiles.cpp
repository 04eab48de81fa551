#include "launcher/planning/split_profiles.h"

#include "base/user_error.h"
#include "launcher/model_factory.h"
#include "planner/traced_memory.h"
#include "runtime/kernel_workspace.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdio>

namespace ht {
namespace {

// One profile per tensor-parallel size: a rank's part of the model, with sequence parallelism
// as the config has it when it splits, else on (Megatron's advice: the same traffic, activations
// stored once across the group). The sizes: the given ones, else the config's, and for a catalog
// device every power of two up to a node's devices; those the model cannot split are left out.
// Sizes asked with --tensor that do not split it are named with why and the sizes that would: a
// warning where some asked size splits it, a UserError where none does.
std::vector<std::pair<int, Config>> tensor_configs(const Config& config, const DataInfo& info, const PlanArgs& args,
                                                   const Machine& machine, bool sequence_parallel) {
  std::vector<int> tensor = args.tensor;
  if (tensor.empty()) tensor.push_back(static_cast<int>(config.parallel.tensor_parallel));
  if (args.tensor.empty() && !config.cluster.device.empty()) {
    for (int t = 1; t <= machine.devices_per_node; t *= 2)
      if (t != tensor.front()) tensor.push_back(t);
  }
  const bool decoder = is_decoder(config.model.name);
  // Why `t` does not split this model ("": it does).
  auto why_not = [&](int t, bool sequence) -> std::string {
    if (t > 1 && !decoder) {
      return std::string("model.name = \"") + choice_name(config.model.name) +
             "\" has no layers built to split across ranks (only gpt and llama do)";
    }
    if (!decoder) return {};
    DecoderOptions o = decoder_options(config.model, info.classes);
    o.tensor_parallel = t;
    o.sequence_parallel = sequence;
    return o.problem();  // heads or widths t does not divide
  };
  std::vector<std::pair<int, Config>> out;
  std::vector<std::string> refused;
  for (int t : tensor) {
    if (t < 1) continue;
    Config c = config;
    c.parallel.tensor_parallel = t;
    c.parallel.sequence_parallel = t > 1 && sequence_parallel;
    if (const std::string why = why_not(t, c.parallel.sequence_parallel); !why.empty()) {
      refused.push_back(std::to_string(t) + ": " + why);
      continue;
    }
    out.emplace_back(t, std::move(c));
  }
  if (!args.tensor.empty() && !refused.empty()) {
    std::string which;  // the sizes that split it, up to 64
    for (int t = 1; t <= 64; ++t) {
      if (why_not(t, t > 1 && sequence_parallel).empty()) which += (which.empty() ? "" : ",") + std::to_string(t);
    }
    std::string reasons;
    for (const std::string& r : refused) reasons += (reasons.empty() ? "" : "; ") + r;
    const std::string advice = "--tensor " + reasons + " (sizes that split this model: --tensor " + which + ")";
    if (out.empty()) throw UserError(config.source + ": no tensor-parallel size asked splits the model: " + advice);
    std::fprintf(stderr, "hybrid_train: warning: left out of the plans: %s\n", advice.c_str());
  }
  return out;
}

// The context sizes to plan at with tensor size `t` (each a profile; PlanArgs::context). Asked
// sizes the sequence cannot split are left out with a warning (all of them: refused).
std::vector<int> context_sizes(const Config& with_t, const DataInfo& info, const PlanArgs& args, const Machine& machine,
                               int most) {
  const Config& config = with_t;
  const int t = static_cast<int>(with_t.parallel.tensor_parallel);
  // Each size is a profile held through the search (a 128K-token trace of Llama 3 8B: about 2.7 GB).
  std::vector<int> sizes = args.context;
  if (sizes.empty()) sizes.push_back(static_cast<int>(config.parallel.context_parallel));
  const bool decoder = is_decoder(config.model.name);
  // Left to the planner (c = 1 configured, none asked): torchtitan's recipe for long sequences on
  // a node, context groups beside ZeRO without tensor groups (its published CP rows are TP 1).
  const bool searched = args.context.empty() && config.parallel.context_parallel == 1 && t == 1;
  if (searched && decoder && !config.cluster.device.empty() && config.model.block_size >= kLongSequence) {
    for (int c = 2; c <= machine.devices_per_node && t * c <= most; c *= 2)
      if (std::find(sizes.begin(), sizes.end(), c) == sizes.end()) sizes.push_back(c);
  }
  std::vector<int> out;
  std::vector<std::string> refused;
  for (int c : sizes) {
    if (c < 1) continue;
    std::string why;
    if (c > 1 && !decoder) {
      why = "model.name = \"" + std::string(choice_name(config.model.name)) + "\" trains on no sequences to split";
    } else if (decoder) {
      DecoderOptions o = decoder_options(config.model, info.classes);
      o.tensor_parallel = t;
      o.sequence_parallel = with_t.parallel.sequence_parallel;
      o.context_parallel = c;
      why = o.problem();  // with the tensor group's split too (sequence parallelism's pieces of T / c)
    }
    if (why.empty()) {
      out.push_back(c);
    } else if (!args.context.empty()) {
      refused.push_back(std::to_string(c) + (t > 1 ? " with --tensor " + std::to_string(t) : "") + ": " + why);
    }
  }
  if (!refused.empty()) {
    std::string reasons;
    for (const std::string& r : refused) reasons += (reasons.empty() ? "" : "; ") + r;
    if (out.empty()) throw UserError(config.source + ": no context-parallel size asked splits the sequence: --context " + reasons);
    std::fprintf(stderr, "hybrid_train: warning: left out of the plans: --context %s\n", reasons.c_str());
  }
  return out;
}

// A profile of this machine: trained at every size a plan uses (its times; or the run's own size,
// PlanArgs::trained_sizes), its memory traced at
// every size the search may use (planner/traced_memory.h), with this CPU's kernel workspaces,
// so only on CPU ranks and where they are known (libtorch 1.13); else the measured points alone.
ModelProfile local_profile(const Config& c, const Dataset& train, const DataInfo& info, const ProfileRequest& request,
                           const std::vector<int64_t>& sizes) {
  ModelProfile profile = profile_job(c, train, info, request);
  if (c.training.device != "cpu" || !this_cpu_workspaces_known()) return profile;
  TraceRequest trace;
  trace.precisions = request.precisions;
  trace.micro_batches = sizes;  // and the trained sizes, where the traces are checked
  for (const ProfilePoint& p : profile.points) trace.micro_batches.push_back(p.micro_batch);
  std::sort(trace.micro_batches.begin(), trace.micro_batches.end());
  trace.micro_batches.erase(std::unique(trace.micro_batches.begin(), trace.micro_batches.end()),
                            trace.micro_batches.end());
  trace.workspaces = WorkspaceRules::kThisCpu;
  trace.fused_optimizer = at::Device(c.training.device).is_cpu();
  trace.train_samples = train.size();
  const ModelProfile traced = trace_profile(c, info, trace);
  const TracedPoints merged = add_traced_points(profile, traced);
  profile.seconds += traced.seconds;
  if (merged.added > 0) profile.how += ", memory also traced at " + std::to_string(merged.added) + " more sizes";
  for (const std::string& why : merged.refused) profile.how += "; traces not used for " + why;
  return profile;
}

// One split's profile (a rank of `c`'s tensor and context groups): traced for a catalog device,
// else measured here. A group of t x c ranks is one replica: its micro-batch reaches the global
// batch over the replicas of the fewest ranks, `largest` (the sizes above a profile's largest are
// extrapolated, and a step's temporaries are not affine in it everywhere).
ModelProfile split_profile(const Config& c, const Dataset* train, const DataInfo& info, ProfileRequest request,
                           TraceRequest trace, int64_t largest) {
  request.largest_micro_batch = largest;
  trace.micro_batches = traced_sizes(largest);
  if (!c.cluster.device.empty()) return trace_profile(c, info, trace);
  return local_profile(c, *train, info, request, trace.micro_batches);
}

}  // namespace

std::vector<RankSplit> profile_splits(const Config& config, const Dataset* train, const DataInfo& info,
                                      const PlanArgs& args, const SplitRequest& r, const Machine& machine,
                                      SplitProfiles& profiles) {
  std::vector<RankSplit> splits;
  std::vector<ContextExchange> exchanges = args.context_exchanges;
  if (exchanges.empty()) exchanges = {config.parallel.context_exchange};
  for (const auto& [t, with_t] : tensor_configs(config, info, args, machine, r.sequence_parallel)) {
    for (int c : context_sizes(with_t, info, args, machine, r.most)) {
      for (ContextExchange exchange : c > 1 ? exchanges : std::vector<ContextExchange>{ContextExchange::kRing}) {
        const RankSplit split{t, c, exchange};
        splits.push_back(split);
        if (args.profiles != nullptr && args.profiles->count(split) > 0) {
          profiles.emplace(split, args.profiles->at(split));
          continue;
        }
        Config split_config = with_t;
        split_config.parallel.context_parallel = c;
        split_config.parallel.context_exchange = exchange;
        const int64_t largest = replica_batch(config.training.global_batch_size, r.fewest, t * c);
        profiles.emplace(split, split_profile(split_config, train, info, r.request, r.trace, largest));
      }
    }
  }
  if (splits.empty()) throw UserError(config.source + ": no tensor- and context-parallel sizes to plan split the model");
  const bool any_context = std::any_of(splits.begin(), splits.end(), [](const RankSplit& s) { return s.context > 1; });
  if (!args.context_exchanges.empty() && !any_context && args.profiles == nullptr) {  // once: not for each larger cluster
    std::fprintf(stderr, "hybrid_train: warning: --context-exchange: no context-parallel size above 1 is planned, so no "
                         "plan exchanges keys and values; ask for one with --context, e.g. --context 1,2\n");
  }
  return splits;
}

}  // namespace ht

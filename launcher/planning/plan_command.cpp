#include "launcher/planning/plan_command.h"

#include "launcher/config/run_plan_of.h"

#include "launcher/config/config_text.h"
#include "launcher/data/dataset.h"
#include "launcher/model_factory.h"
#include "launcher/planning/device_catalog.h"
#include "launcher/planning/model_size.h"
#include "base/json.h"
#include "training/run_output.h"
#include "base/user_error.h"
#include "alloc/byte_size.h"
#include "alloc/cpu_device_allocator.h"
#include "planner/cost_model.h"
#include "planner/plan_frontier.h"
#include "planner/plan_report.h"
#include "planner/shard_terms.h"
#include "runtime/thread_pools.h"

#include <cstdio>
#include <malloc.h>
#include <tuple>
#include <map>
#include <filesystem>
#include <fstream>

namespace ht {
namespace {

std::string plan_toml(const Config& config, const JobPlan& plan) {
  const Plan& p = plan.ranked[0].plan;
  const Prediction& r = plan.ranked[0].prediction;
  std::string head = "# Written by hybrid_train plan " + config.source + ": " + plan_words(p) + ".\n";
 char step[32];
  std::snprintf(step, sizeof step, "%.1f", r.step_ms);
  head += "# Predicted: peak " + format_bytes(r.peak_bytes) + " per rank, step " + step +
          " ms.\n# Train it: " + (p.devices() > 1 ? "mpirun -np " + std::to_string(p.devices()) + " " : std::string()) +
          "hybrid_train " + config.job.output_dir + "/plan.toml\n";
  return head + resolved_toml(config_for_plan(config, p));
}

// The predicted compute split by op as the step the cost model prices at a plan's micro-batch
// splits it (its share of each op), by the profile of the plan's split (tensor, context, exchange), the
// micro-batch and the precision (the kernels' times do not depend on the batch accumulated): a
// search's thousands of plans price a few dozen steps' kernels (kernel_times: no trace is made).
using OpShares = std::vector<std::pair<std::string, double>>;
class OpSharesOfPlans {
 public:
  explicit OpSharesOfPlans(const JobPlan& plan) : plan_(plan) {}
  const OpShares* of(const Plan& p) {
    const auto profile = plan_.split_profiles.find(p.split());
    if (profile == plan_.split_profiles.end() || profile->second.points.empty()) return nullptr;
    const auto key = std::make_tuple(p.split(), p.micro_batch, static_cast<int>(p.precision));
    auto it = shares_.find(key);
    if (it == shares_.end()) {
      OpShares shares;
      for (const auto& [op, share] : time_shares_by_op(kernel_times(profile->second, p.micro_batch, p.precision)))
        shares.emplace_back(op, share);
      it = shares_.emplace(key, std::move(shares)).first;
    }
    return &it->second;
  }

 private:
  const JobPlan& plan_;
  std::map<std::tuple<RankSplit, int64_t, int>, OpShares> shares_;
};

JsonObject plan_record(const RankedPlan& r, const OpShares* shares) {
  JsonObject o;
  const Plan& p = r.plan;
  const Prediction& d = r.prediction;
  o.add("ranks", static_cast<int64_t>(p.devices())).add("data_parallel", static_cast<int64_t>(p.ranks))
      .add("pipeline_parallel", static_cast<int64_t>(p.stages)).add("tensor_parallel", static_cast<int64_t>(p.tensor))
      .add("context_parallel", static_cast<int64_t>(p.context))
      .add("context_exchange", std::string(choice_name(p.context_exchange)))
      .add("sequence_parallel", p.sequence_parallel).add("micro_batch", p.micro_batch).add("accumulation", p.accumulation)
      .add("precision", std::string(choice_name(p.precision))).add("policy", std::string(choice_name(p.policy))).add("budget_bytes", p.budget_bytes)
      .add("shard", std::string(choice_name(p.shard))).add("prefetch", static_cast<int64_t>(prefetch_depth(p)));
  if (p.policy == MemoryPolicy::kPerBlock) o.add("block_keep_share", p.block_keep_share);
  if (!p.stage_block_keep.empty()) o.add("stage_block_keep", p.stage_block_keep);
  if (!d.stage_peak_bytes.empty()) {
    std::vector<double> peaks(d.stage_peak_bytes.begin(), d.stage_peak_bytes.end());
    o.add("stage_peak_bytes", peaks);
  }
  o.add("fits", d.fits).add("peak_bytes", d.peak_bytes).add("activation_bytes", d.activation_bytes)
      .add("step_ms", d.step_ms).add("compute_ms", d.compute_ms).add("recompute_ms", d.recompute_ms)
      .add("optimizer_ms", d.optimizer_ms).add("allreduce_exposed_ms", d.allreduce_exposed_ms)
      .add("gather_ms", d.gather_ms).add("gather_hidden_ms", d.gather_hidden_ms).add("optimizer_state_bytes", d.optimizer_state_bytes)
      .add("checkpoint_host_bytes", d.checkpoint_host_bytes)
      .add("bubble_ms", d.bubble_ms).add("transfer_ms", d.transfer_ms).add("tensor_ms", d.tensor_ms)
      .add("evictions", d.evictions).add("samples_per_s", d.samples_per_s)
      .add("device_hours_per_epoch", d.device_hours_per_epoch).add("mfu", d.mfu)
      .add("tokens_per_s", d.tokens_per_s).add("device_hours_per_billion_tokens", d.device_hours_per_billion_tokens);
  // Beside a run's measured "time_by_op" record (metrics.time_by_op), it names the ops a miss
  // comes from.
  if (shares != nullptr) {
    JsonObject by_op;
    for (const auto& [op, share] : *shares) by_op.add(op, share * d.compute_ms);
    o.add("compute_by_op_ms", by_op);
  }
  return o;
}

// A device too small for the model's own state has no plan; say so before anything is written.
void check_machine(const Config& config, const JobPlan& plan) {
  const int64_t state = plan.profile.parameter_bytes + plan.profile.gradient_bytes + plan.profile.optimizer_state_bytes;
  if (plan.machine.device_memory > 0 && plan.machine.device_memory <= state) {
    throw UserError("--device-memory " + format_bytes(plan.machine.device_memory) + " cannot hold model " +
                    choice_name(config.model.name) + "'s parameters, gradients and " + choice_name(config.training.optimizer) + " state (" +
                    format_bytes(state) + "); give a device larger than that, e.g. --device-memory " +
                    format_bytes(state * 2) + ", or plan a smaller model");
  }
}

// 16-bit products with a dimension off the tensor cores' alignment (GPT-2's 50,257-word output
// layer) run at a seventh of the aligned rate on an H200 (docs/gpu.md): where they take a tenth
// of the chosen plan's compute or more, say so, and how much a padded vocabulary would save.
void note_misaligned_products(const Config& config, const PlanCommand& command, const JobPlan& plan) {
  const RankedPlan& best = plan.ranked[0];
  if (plan.profile.points.empty()) return;
  const Plan& p = best.plan;
  const StepTrace trace = trace_for(plan.profile, p.micro_batch, p.micro_batch * p.accumulation, p.precision);
  const DeviceRates rates = device_rates(catalog_kind(config.cluster.device, command.args.devices_file, "--cluster"));
  const MisalignedTime t = misaligned_time(trace, rates);
  if (t.share < 0.1) return;
  std::string fix = "padding the odd dimension to a multiple of 64 would";
  const int64_t vocab = config.model.vocab_size;
  if (is_decoder(config.model.name) && vocab % 8 != 0) {
    fix = "model.vocab_size = " + std::to_string(vocab) + " is the odd one: --model.vocab_size=" +
          std::to_string((vocab + 63) / 64 * 64) + " (a multiple of 64, as nanoGPT and llm.c pad GPT-2's) would";
  }
  std::printf("note: %.0f%% of the step's compute is 16-bit products with a dimension that is not a multiple of 8, "
              "which run at 0.13-0.19 of the aligned rate (measured on an H200, docs/gpu.md); %s save about %.0f ms "
              "a step (%.0f%%)\n",
              100 * t.share, fix.c_str(), t.saved_share * best.prediction.compute_ms, 100 * t.saved_share * best.prediction.compute_ms /
              std::max(best.prediction.step_ms, 1e-9));
}

// The chosen layout's memory/time frontier, and the best recomputing plan's where that is another
// layout ("more GPUs or more recomputation" as two frontiers); what a per-block plan keeps.
void print_frontiers(const JobPlan& plan) {
  const Plan& chosen = plan.ranked[0].plan;
  const RankedPlan* saver = nullptr;
  for (const RankedPlan& r : plan.ranked)
    if (r.prediction.fits && recomputes_blocks(r.plan.policy) && (saver == nullptr)) saver = &r;
  auto profile_of = [&](const Plan& p) -> const ModelProfile& {
    auto it = plan.split_profiles.find(p.split());
    return it != plan.split_profiles.end() ? it->second : plan.profile;
  };
  for (const Plan* p : {&chosen, saver != nullptr && !same_layout(saver->plan, chosen) ? &saver->plan : nullptr}) {
    if (p == nullptr) continue;
    const std::string frontier = frontier_text(plan.ranked, *p);
    if (!frontier.empty()) {
      std::printf("\nmemory/time frontier of %s%s:\n%s", p == &chosen ? "the chosen layout" : "the best recomputing layout",
                  p == &chosen ? "" : (" (" + plan_words(*p) + ")").c_str(), frontier.c_str());
    }
  }
  const Plan* blocks = chosen.policy == MemoryPolicy::kPerBlock ? &chosen
                       : saver != nullptr && saver->plan.policy == MemoryPolicy::kPerBlock ? &saver->plan : nullptr;
  if (blocks != nullptr) {
    std::printf("\nper_block in the %s plan:\n%s", blocks == &chosen ? "chosen" : "best recomputing",
                block_kinds_text(profile_of(*blocks), *blocks).c_str());
  }
}

}  // namespace

int run_plan_command(const Config& config, const PlanCommand& command) {
  // [cluster].device: the model is traced on meta tensors, never run here: any size, any device.
  const bool traced = !config.cluster.device.empty();
  // The search makes and drops steps of tens of MB (a 70B trace at a plan's sizes, the walks along
  // it): kept by malloc rather than mapped and unmapped each time, whose page faults took a tenth
  // of a 70B plan's time.
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  if (config.training.device != "cpu" && !traced) {
    throw UserError(config.source + ": training.device = \"" + config.training.device + "\": plan profiles CPU ranks "
                    "only (not built for GPUs yet); plan with --training.device=cpu");
  }
  const int threads = config.training.threads > 0 ? static_cast<int>(config.training.threads) : default_thread_count(1);
  set_compute_threads(threads);
  CpuAllocationCounter::install();
  set_host_memory_caching(config.memory.host_cache);
  DataSplits data;
  if (traced && is_decoder(config.model.name) && config.model.vocab_size > 0) {
    // A language model's shapes are the config's: its data need not be here.
    data.info = DataInfo{Task::kLanguageModel, {config.model.block_size}, config.model.vocab_size, "tokens", 0};
  } else {
    const RankShare share{budget_bytes_of(config), configured_micro_batch(config), 1, config.training.device};
    if (config.model.vocab_size > 0 && !traced) refuse_a_model_too_large_here(config, share, config.model.vocab_size, 1, "plan");
    data = make_datasets(config);
    if (!traced) refuse_a_model_too_large_here(config, share, data.info.classes, 1, "plan");
  }
  std::printf("hybrid_train plan %s: model %s, global batch %lld\n", config.source.c_str(), choice_name(config.model.name),
              static_cast<long long>(config.training.global_batch_size));
  std::fflush(stdout);
  const JobPlan plan = plan_job(config, data.train.get(), data.info, command.args);
  std::printf("%s", profile_text(plan.profile, plan.machine).c_str());
  if (!plan.time_source.empty()) std::printf("%s\n", plan.time_source.c_str());
  std::printf("\n");
  std::printf("plans (%s first):\n%s\n", command.args.objective == Objective::kTime ? "fastest" : "cheapest",
              plans_table(plan.ranked, command.all_rows ? plan.ranked.size() : 15, plan.profile.tokens_per_sample > 0).c_str());
  if (plan.ranked.empty() || !plan.ranked[0].prediction.fits) {
    if (traced) {
      PlanArgs args = command.args;
      args.train_samples = plan.profile.train_samples;
      const std::string bigger = smallest_fitting_cluster(config, data.info, args, plan);
      throw UserError(config.source + ": no plan fits " + std::to_string(plan.machine.max_ranks()) + " device(s) of " +
                      format_bytes(plan.machine.device_memory) + " (the smallest predicted peak is " +
                      (plan.ranked.empty() ? std::string("?") : format_bytes(plan.ranked[0].prediction.peak_bytes)) +
                      " per device); " + (bigger.empty() ? "no cluster of this kind up to 128 nodes fits it either"
                                                          : "the smallest cluster of this kind that fits it: --cluster " + bigger));
    }
    check_machine(config, plan);
    std::printf("no plan fits: the smallest predicted peak is %s per rank; more memory per device, or more ranks, "
                "is needed\n", plan.ranked.empty() ? "?" : format_bytes(plan.ranked[0].prediction.peak_bytes).c_str());
    return kUserErrorExitCode;
  }
  std::printf("chosen: %s. %s\n", plan_words(plan.ranked[0].plan).c_str(), plan.why.c_str());
  print_frontiers(plan);
  if (traced) note_misaligned_products(config, command, plan);
  if (traced && evicts(plan.ranked[0].plan.policy)) {
    std::printf("note: it evicts under a budget on each GPU, which this engine has not yet run on a GPU "
                "(docs/gpu.md); more devices without eviction: rerun with a larger --cluster\n");
  }
  std::error_code ec;
  std::filesystem::create_directories(config.job.output_dir, ec);
  if (ec) throw UserError("job.output_dir = \"" + config.job.output_dir + "\": cannot create it (" + ec.message() + ")");
  const std::filesystem::path dir(config.job.output_dir);
  write_file_atomically((dir / "plan.toml").string(), plan_toml(config, plan));
  std::string lines;
  OpSharesOfPlans shares(plan);
  for (const RankedPlan& r : plan.ranked) lines += plan_record(r, shares.of(r.plan)).str() + "\n";
  write_file_atomically((dir / "plans.jsonl").string(), lines);
  std::printf("wrote %s/plan.toml (train it as is) and plans.jsonl (every plan)\n", config.job.output_dir.c_str());
  return 0;
}

}  // namespace ht

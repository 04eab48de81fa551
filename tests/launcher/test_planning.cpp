// The planner against the engine it predicts: the profile's model state to the byte, predicted
// peaks against measured ones, the DTR replay against a real run's evictions, `hybrid_train plan`
// and parallel.strategy = "auto" as users run them, and a refusal whose suggestion fits.
#include "launcher/config/config_schema.h"
#include "launcher/job.h"
#include "launcher/model_factory.h"
#include "launcher/config/run_plan_of.h"
#include "launcher/planning/job_plan.h"
#include "launcher/planning/profiler.h"
#include "launcher/planning/run_check.h"
#include "base/user_error.h"
#include "planner/recompute_terms.h"
#include "planner/weight_copy_terms.h"
#include "alloc/cpu_device_allocator.h"
#include "runtime/kernel_workspace.h"
#include "tests/support/mpi_job.h"
#include "tests/support/run_binary.h"
#include "tests/support/run_records.h"
#include "tests/support/temp_dir.h"

#include <gmock/gmock.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <sstream>
#include <sys/wait.h>

namespace ht::test {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const char* kConv = kTinyConvNet;

const char* kGptToPlan = kTinyGpt;

// A number from a JSON file written by the run: "key": value.
double json_number(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::smatch m;
  if (!std::regex_search(text, m, std::regex("\"" + key + "\": ([-0-9.e+]+)"))) {
    ADD_FAILURE() << key << " not in " << path;
    return -1;
  }
  return std::stod(m[1]);
}

int64_t arena_sum(const std::vector<at::Tensor>& tensors) {
  int64_t bytes = 0;
  for (const at::Tensor& t : tensors) bytes += arena_bytes(static_cast<int64_t>(t.nbytes()));
  return bytes;
}

ModelProfile profile_of(const Config& c, int64_t largest_micro) {
  const DataSplits data = make_datasets(c);
  ProfileRequest request;
  request.precisions = {c.training.mixed_precision};
  request.largest_micro_batch = largest_micro;
  request.threads = 1;
  return profile_job(c, *data.train, data.info, request);
}

TEST(Planning, ProfileCountsModelStateToTheByte) {
  TempDir dir;
  for (const char* toml : {kConv, kGptToPlan}) {
    const Config c = config_for(dir, toml, {});
    const ModelProfile p = profile_of(c, 8);
    at::manual_seed(c.job.seed);
    HostAllocationScope host;
    const DataSplits data = make_datasets(c);
    auto model = make_model(c, data.info);
    const std::vector<at::Tensor> params = model->parameters();
    int64_t param_bytes = arena_sum(params), param_elements = 0;
    for (const at::Tensor& t : params) param_elements += t.numel();
    EXPECT_EQ(p.parameter_bytes, param_bytes + arena_sum(model->buffers())) << choice_name(c.model.name);
    EXPECT_EQ(p.gradient_bytes, arena_bytes(param_elements * 4)) << choice_name(c.model.name) << ": one fp32 block";
    // SGD with momentum: one buffer per parameter; AdamW: two; moved into one block after the
    // first step (training/compact.h).
    EXPECT_EQ(p.optimizer_state_bytes, arena_bytes((c.training.optimizer == OptimizerKind::kAdamw ? 2 : 1) * param_elements * 4))
        << choice_name(c.model.name);
  }
}

TEST(Planning, PredictedPeakIsTheMeasuredOne) {
  TempDir dir;
  struct Case {
    const char* toml;
    std::vector<std::string> args;
  };
  const std::vector<Case> cases{
      {kConv, {"--memory.budget=256MiB"}},
      {kConv, {"--memory.budget=256MiB", "--training.micro_batch_size=8"}},
      {kConv, {"--memory.budget=256MiB", "--training.mixed_precision=bf16"}},
      {kGptToPlan, {"--memory.budget=256MiB", "--training.micro_batch_size=4"}},
      // Without a budget the same bytes: the rank's device memory, not the 4 MiB data set beside
      // it (counted until the measurement excluded host data: 3-7x the prediction).
      {kConv, {"--data.synthetic_samples=4096"}},
      {kGptToPlan, {"--data.synthetic_samples=8192", "--training.micro_batch_size=4"}},
      // One micro-batch a step without a gradient block: a gradient exists from the kernel that
      // makes it (predicted with all of them, a 4-layer GPT's peak was 6.8% over).
      {kGptToPlan, {"--data.synthetic_samples=8192"}},
  };
  for (const Case& k : cases) {
    std::vector<std::string> args = k.args;
    args.push_back("--job.output_dir=" + dir.path("run"));
    run_job(config_for(dir, k.toml, args), true);
    const double predicted = json_number(dir.path("run/summary.json"), "predicted_peak_bytes");
    const double measured = json_number(dir.path("run/summary.json"), "mem_peak_bytes");
    // The run's micro-batch size traced with this CPU's kernel workspaces (measured to 0.36% at
    // most, ATen's 64-byte scalars and host-side blocks the trace does not see); where they are
    // not known (another libtorch), the activations the profile measured at the run's own size.
    if (std::abs(predicted / measured - 1.0) <= (this_cpu_workspaces_known() ? 0.005 : 0.05)) continue;
    // Off: what the profile measured, for the failure's message (on libtorch 2.11's CPU, the
    // GPU machine's, the ConvNet at micro-batch 8 measured 14% under its prediction).
    const Config c = config_for(dir, k.toml, args);
    std::ostringstream points;
    for (const ProfilePoint& p : profile_of(c, run_plan_of(c).batch.micro).points) {
      points << "\n  profiled micro-batch " << p.micro_batch << ": forward-backward peak " << p.forward_backward_peak_bytes
             << ", persistent " << p.persistent_bytes << ", batch " << p.batch_bytes << ", activations "
             << p.activation_bytes() << ", optimizer peak " << p.optimizer_peak_bytes;
    }
    ADD_FAILURE() << k.args.front() << " " << k.args.back() << ": predicted " << predicted << " vs measured " << measured
                  << " bytes (within 5% expected)" << points.str();
  }
}


// One case: the run's peak with room to spare, then a budget of `share` of it with LRU eviction
// (its choices depend on sizes and order, not on timed kernels, so a run repeats itself), each
// kernel evicting down to `threshold` of the budget (memory.eviction_threshold).
void expect_replay_matches(const char* toml, int64_t micro, double share, double threshold = 0.9) {
  TempDir dir;
  run_job(config_for(dir, toml, {"--memory.budget=256MiB", "--job.output_dir=" + dir.path("roomy")}), true);
  const auto peak = static_cast<int64_t>(json_number(dir.path("roomy/summary.json"), "mem_peak_bytes"));
  const std::string budget = "--memory.budget=" + std::to_string(static_cast<int64_t>(peak * share));
  const Config tight = config_for(dir, toml, {budget, "--memory.policy=lru", "--job.output_dir=" + dir.path("tight"),
                                              "--memory.eviction_threshold=" + std::to_string(threshold)});
  const ModelProfile profile = profile_of(tight, micro);
  Machine machine;
  machine.device_memory = budget_bytes_of(tight);
  Plan plan;
  plan.micro_batch = micro;
  plan.policy = MemoryPolicy::kLru;
  plan.budget_bytes = budget_bytes_of(tight);
  plan.eviction_threshold = threshold;
  plan.eviction_threshold = threshold;
  const Prediction predicted = predict(profile, machine, plan);
  ASSERT_TRUE(predicted.fits) << predicted.why_not;
  ASSERT_GT(predicted.evictions, 0);
  run_job(tight, true);
  // The last step's record: a steady step, like the profiled one.
  const double measured = last_train_number(dir.path("tight/metrics.jsonl"), "evictions");
  std::printf("replay: %lld evictions predicted, %.0f measured at %.0f%% of the peak, threshold %.2f\n",
              static_cast<long long>(predicted.evictions), measured, share * 100, threshold);
  // The replay scores, chooses and ticks as the engine does (memory/eviction_score.h), and here it
  // evicts exactly as often (17 and 32 at 70% and 60%, 2026-11-25; 15, 19 and 12 at 70%, 65% and
  // 65% with threshold 1, 2026-12-02). The tolerance, 10%, is for
  // what it still cannot mirror (planner/dtr_replay.h): a trace records no kernel's other outputs.
  const double ratio = static_cast<double>(predicted.evictions) / measured;
  EXPECT_GE(ratio, 0.9) << predicted.evictions << " predicted, " << measured << " measured";
  EXPECT_LE(ratio, 1.1) << predicted.evictions << " predicted, " << measured << " measured";
}

TEST(Planning, ReplayPredictsARealRunsEvictions) {
  // (The small ConvNet evicts 1-3 tensors a step near the budgets it can run in: too few to compare.)
  // (0.65, not 0.6, since 2026-12-02: attention no longer concatenates its blocks, the step's
  // peak fell, and at 60% of it the replay keeps its fragmentation margin and refuses.)
  expect_replay_matches(kGptToPlan, 16, 0.7);
  expect_replay_matches(kGptToPlan, 16, 0.65);
  // Evicting only what each kernel needs: the plan carries the run's threshold.
  expect_replay_matches(kGptToPlan, 16, 0.65, 1.0);
}

// memory.policy = "full": the profiled step replayed with its blocks dropped as the run drops them
// predicts the run's peak and its regenerations, here (the whole step in the arena) and as a
// cluster's device is planned (the blocks' activations replayed once, the state added).
TEST(Planning, PredictsFullRecomputationsPeakAndRegenerations) {
  TempDir dir;
  const std::vector<std::string> deeper{"--model.n_layer=6", "--model.block_size=64", "--memory.budget=256MiB"};
  auto with = [&](std::vector<std::string> a) {
    a.insert(a.end(), deeper.begin(), deeper.end());
    return a;
  };
  const Config plain = config_for(dir, kGptToPlan, with({"--job.output_dir=" + dir.path("plain")}));
  const Config full = config_for(dir, kGptToPlan, with({"--memory.policy=full", "--job.output_dir=" + dir.path("full")}));
  const ModelProfile profile = profile_of(full, 16);
  Plan plan;
  plan.micro_batch = 16;
  plan.policy = MemoryPolicy::kFull;
  plan.budget_bytes = budget_bytes_of(full);
  Machine here;
  here.device_memory = budget_bytes_of(full);
  Machine cluster = here;
  cluster.shared_host = false;
  const Prediction replayed = predict(profile, here, plan), blocks = predict(profile, cluster, plan);
  ASSERT_TRUE(replayed.fits) << replayed.why_not;
  ASSERT_TRUE(blocks.fits) << blocks.why_not;
  run_job(plain, true);
  run_job(full, true);
  const std::string metrics = dir.path("full/metrics.jsonl");
  const double measured = last_train_number(metrics, "mem_peak_bytes");
  const double without = last_train_number(dir.path("plain/metrics.jsonl"), "mem_peak_bytes");
  std::printf("full: predicted peak %lld (here), %lld (a cluster's), measured %.0f (without: %.0f)\n",
              static_cast<long long>(replayed.peak_bytes), static_cast<long long>(blocks.peak_bytes), measured, without);
  EXPECT_LT(measured, without * 0.8);
  EXPECT_NEAR(static_cast<double>(replayed.peak_bytes) / measured, 1.0, 0.02);
  EXPECT_NEAR(static_cast<double>(blocks.peak_bytes) / measured, 1.0, 0.05);
  EXPECT_EQ(static_cast<double>(replayed.evictions), last_train_number(metrics, "evictions"));
  EXPECT_GT(replayed.recompute_ms, 0);
  EXPECT_EQ(replayed.evictions, blocks.evictions);
}

// memory.policy = "per_block": the replay records each block and solves its plan as the run does,
// so the peak and the regenerations of each share of the ladder are the run's, here and (the
// blocks replayed once, the state added) as a cluster's device is planned; and so for a block
// keeping bytes (the half share's kept bytes: as a cluster's device, it was once priced as full).
TEST(Planning, PredictsPerBlockPlansPeakAndRegenerations) {
  TempDir dir;
  const std::vector<std::string> deeper{"--model.n_layer=6", "--model.block_size=64", "--memory.budget=256MiB",
                                        "--memory.policy=per_block"};
  int64_t half_kept_bytes = 0;
  int64_t half_peak_cluster = 0, full_peak_cluster = 0;
  for (const double share : {0.5, 0.875, 0.0}) {
    const bool bytes = share == 0;  // the half share's kept bytes, as bytes
    const std::string out = bytes ? std::string("bytes") : "keep" + std::to_string(static_cast<int>(share * 1000));
    std::vector<std::string> args = deeper;
    args.push_back("--memory.block_keep=" + (bytes ? std::to_string(half_kept_bytes) : std::to_string(100 * share) + "%"));
    args.push_back("--job.output_dir=" + dir.path(out));
    const Config config = config_for(dir, kGptToPlan, args);
    const ModelProfile profile = profile_of(config, 16);
    Plan plan;
    plan.micro_batch = 16;
    plan.policy = MemoryPolicy::kPerBlock;
    plan.block_keep_share = share;
    plan.block_keep_bytes = bytes ? half_kept_bytes : 0;
    plan.budget_bytes = budget_bytes_of(config);
    if (share == 0.5) {
      const BlockRecomputeReplay half = block_recompute_terms(profile, plan);
      ASSERT_TRUE(half.block);
      half_kept_bytes = half.block->plan.kept_bytes;
      ASSERT_GT(half_kept_bytes, 0);
    }
    Machine here;
    here.device_memory = plan.budget_bytes;
    Machine cluster = here;
    cluster.shared_host = false;
    const Prediction replayed = predict(profile, here, plan), blocks = predict(profile, cluster, plan);
    ASSERT_TRUE(replayed.fits) << replayed.why_not;
    ASSERT_TRUE(blocks.fits) << blocks.why_not;
    run_job(config, true);
    const std::string metrics = dir.path(out + "/metrics.jsonl");
    const double measured = last_train_number(metrics, "mem_peak_bytes");
    std::printf("per_block at %.3f: predicted peak %lld (here), %lld (a cluster's), measured %.0f\n", share,
                static_cast<long long>(replayed.peak_bytes), static_cast<long long>(blocks.peak_bytes), measured);
    EXPECT_NEAR(static_cast<double>(replayed.peak_bytes) / measured, 1.0, 0.02) << share;
    EXPECT_NEAR(static_cast<double>(blocks.peak_bytes) / measured, 1.0, 0.05) << share;
    EXPECT_EQ(static_cast<double>(replayed.evictions), last_train_number(metrics, "evictions")) << share;
    EXPECT_EQ(replayed.evictions, blocks.evictions) << share;
    if (share == 0.5) {
      half_peak_cluster = blocks.peak_bytes;
      Plan full = plan;
      full.policy = MemoryPolicy::kFull;
      full.block_keep_share = 0;
      full_peak_cluster = predict(profile, cluster, full).peak_bytes;
    }
    if (bytes) {
      EXPECT_EQ(blocks.peak_bytes, half_peak_cluster) << "the same plan, given as bytes";
      EXPECT_GT(blocks.peak_bytes, full_peak_cluster) << "it keeps more than full recomputation";
    }
  }
}

// Pipeline stages on CPU ranks are priced from the blocks' replay, which cannot see what backward's
// prefetches of offloaded values add (a stage ran out of room in a budget 3% over its prediction):
// a stage within 5% of its budget is a tight fit (warned, trained), as eviction_terms' replay at
// 95% makes it for one stage.
TEST(Planning, PipelineStagesKeepAFivePercentMarginUnderABudget) {
  TempDir dir;
  const Config config = config_for(dir, kGptToPlan, {"--model.n_layer=6", "--model.block_size=64",
                                                     "--memory.budget=256MiB", "--memory.policy=per_block"});
  const ModelProfile profile = profile_of(config, 4);
  Plan plan;
  plan.micro_batch = 4;
  plan.accumulation = 4;
  plan.stages = 2;
  plan.ranks = 1;
  plan.policy = MemoryPolicy::kPerBlock;
  plan.block_offload = true;
  plan.stage_block_keep = {0.0, 0.0};
  auto at = [&](int64_t budget) {
    plan.budget_bytes = budget;
    Machine here;
    here.device_memory = budget;
    return predict(profile, here, plan);
  };
  const Prediction roomy = at(budget_bytes_of(config));
  ASSERT_TRUE(roomy.fits) << roomy.why_not;
  const int64_t peak = roomy.peak_bytes;
  const Prediction tight = at(peak * 103 / 100);
  EXPECT_FALSE(tight.fits);
  EXPECT_TRUE(tight.within_margin) << tight.why_not;
  EXPECT_THAT(tight.why_not, HasSubstr("leaves less than 5% of the budget"));
  EXPECT_EQ(tight.peak_bytes, peak) << "the same plan, only its margin short";
  const Prediction enough = at(peak * 106 / 100);
  EXPECT_TRUE(enough.fits) << enough.why_not;
}

// Full recomputation in bf16, the weights cast at each read or kept once a step: each run's peak
// as the planner predicts it (kept copies beside one block's casts at most: weight_kept_twin), a
// search that leaves the choice to auto keeps them where they fit, and they train the same bits.
TEST(Planning, PredictsFullRecomputationWithKeptWeightCopies) {
  TempDir dir;
  const std::vector<std::string> deeper{"--model.n_layer=6", "--model.block_size=64", "--memory.budget=256MiB",
                                        "--memory.policy=full", "--training.mixed_precision=bf16"};
  std::map<std::string, std::vector<at::Tensor>> trained;
  std::map<std::string, int64_t> predicted;
  for (const std::string mode : {"cast", "kept"}) {
    std::vector<std::string> a = deeper;
    a.push_back("--training.compute_weights=" + mode);
    a.push_back("--job.output_dir=" + dir.path(mode));
    const Config c = config_for(dir, kGptToPlan, a);
    const ModelProfile profile = profile_of(c, 16);
    Plan plan;
    plan.micro_batch = 16;
    plan.precision = MixedPrecision::kBf16;
    plan.policy = MemoryPolicy::kFull;
    plan.budget_bytes = budget_bytes_of(c);
    Machine here;
    here.device_memory = budget_bytes_of(c);
    const std::function<Prediction(const Plan&)> predict_here = [&](const Plan& p) { return predict(profile, here, p); };
    Plan chosen = plan;  // auto: what a search makes of it
    ASSERT_TRUE(predict_with_weights_that_fit(chosen, predict_here).fits);
    EXPECT_EQ(chosen.compute_weights, ComputeWeightsMode::kKept) << "roomy: kept copies fit";
    plan.compute_weights = mode == "kept" ? ComputeWeightsMode::kKept : ComputeWeightsMode::kCast;
    const Prediction replayed = predict_here(plan);
    ASSERT_TRUE(replayed.fits) << replayed.why_not;
    const JobOutcome run = run_job(c, true);
    for (const auto& t : run.model->parameters()) trained[mode].push_back(t.detach().clone());
    const double measured = last_train_number(dir.path(mode + "/metrics.jsonl"), "mem_peak_bytes");
    std::printf("full, bf16, %s: predicted peak %lld, measured %.0f; copies %lld\n", mode.c_str(),
                static_cast<long long>(replayed.peak_bytes), measured,
                static_cast<long long>(replayed.weight_copy_bytes));
    EXPECT_NEAR(static_cast<double>(replayed.peak_bytes) / measured, 1.0, 0.01) << mode;
    predicted[mode] = replayed.peak_bytes;
    if (mode == "kept") {
      EXPECT_GT(replayed.weight_copy_bytes, 0);
    }
  }
  EXPECT_GT(predicted["kept"], predicted["cast"]);
  ASSERT_EQ(trained["cast"].size(), trained["kept"].size());
  for (size_t i = 0; i < trained["cast"].size(); ++i) EXPECT_TRUE(trained["cast"][i].equal(trained["kept"][i])) << i;
}

// The profile trains every size from 1 sample up, and this machine's drift lands on any of them:
// full recomputation across stages is replayed at the plan's own size, never extrapolated from the
// two smallest sizes' measured times (at 1 and 2 samples a slow moment once put a ConvNet's
// regenerations at 16 below zero, and `plan` failed on a negative stage cost).
TEST(Planning, MeasuredTimesAreNotExtrapolatedFromTheTwoSmallestSizes) {
  TempDir dir;
  const Config c = config_for(dir, kConv, {});
  const ModelProfile profile = profile_of(c, 32);
  ModelProfile drifted = profile;
  for (ProfilePoint& pt : drifted.points) {
    if (pt.micro_batch != 1) continue;
    pt.forward_backward_ms *= 10;  // measured in a slow moment
    for (TraceKernel& k : pt.trace.kernels) k.ms *= 10;
  }
  Plan plan;
  plan.micro_batch = 16;
  plan.accumulation = 2;
  plan.stages = 2;
  plan.policy = MemoryPolicy::kFull;
  plan.budget_bytes = int64_t{256} << 20;
  Machine here;
  here.device_memory = plan.budget_bytes;
  ASSERT_TRUE(replays_blocks(here, plan));
  const Prediction clean = predict(profile, here, plan), slow = predict(drifted, here, plan);
  ASSERT_TRUE(clean.fits) << clean.why_not;
  EXPECT_GT(slow.recompute_ms, 0);
  EXPECT_DOUBLE_EQ(slow.recompute_ms, clean.recompute_ms);
}

// memory.policy = "static": the profiled step's graph planned for the budget, as the run plans its
// own captured step. Both weigh the modelled kernel costs and the run solves by the heuristic alone
// (memory.solve_time_s = 0), as the planner predicts: the same plan, whatever the machine's load.
// (With the MIP, a run may find a cheaper plan in its time limit, whose peak is another one under
// the same budget.)
TEST(Planning, PredictsTheStaticPlanARunMakes) {
  TempDir dir;
  run_job(config_for(dir, kGptToPlan, {"--memory.budget=256MiB", "--job.output_dir=" + dir.path("roomy")}), true);
  const auto peak = static_cast<int64_t>(json_number(dir.path("roomy/summary.json"), "mem_peak_bytes"));
  const Config tight = config_for(dir, kGptToPlan, {"--memory.budget=" + std::to_string(peak * 7 / 10), "--memory.policy=static", "--memory.solve_time_s=0",
                                              "--job.output_dir=" + dir.path("tight")});
  const ModelProfile profile = profile_of(tight, 16);
  ASSERT_FALSE(profile.points.front().graph.forward.empty()) << "the profiled step's graph was not captured";
  Machine machine;
  machine.device_memory = budget_bytes_of(tight);
  Plan plan;
  plan.micro_batch = 16;
  plan.policy = MemoryPolicy::kStatic;
  plan.budget_bytes = budget_bytes_of(tight);
  const Prediction predicted = predict(profile, machine, plan);
  ASSERT_TRUE(predicted.fits) << predicted.why_not;
  EXPECT_TRUE(predicted.static_plan);
  EXPECT_GT(predicted.evictions, 0);
  EXPECT_GT(predicted.recompute_ms, 0);
  EXPECT_LE(predicted.peak_bytes, budget_bytes_of(tight));
  // Without a static plan the same budget is predicted by DTR's replay: not a plan.
  plan.policy = MemoryPolicy::kDtr;
  EXPECT_FALSE(predict(profile, machine, plan).static_plan);

  run_job(tight, true);
  const std::string metrics = dir.path("tight/metrics.jsonl");
  EXPECT_GE(last_train_number(metrics, "plan_hits"), 2) << "steps 2 to 4 run on the plan";
  const double measured = last_train_number(metrics, "mem_peak_bytes");
  std::printf("static plan: predicted peak %lld, measured %.0f, budget %lld\n",
              static_cast<long long>(predicted.peak_bytes), measured, static_cast<long long>(budget_bytes_of(tight)));
  EXPECT_NEAR(static_cast<double>(predicted.peak_bytes) / measured, 1.0, 0.01);
  // The run predicted itself the same way before its first step.
  EXPECT_NEAR(json_number(dir.path("tight/summary.json"), "predicted_peak_bytes") / measured, 1.0, 0.05);
}

// Host swap, predicted from the profiled step by the runtime's rules (planner/swap_terms.h): the
// bytes copied out each step against the run's own count. (vDNN's rule is the same set every step;
// the measured steady steps copy a little more: values recomputed and saved again.)
TEST(Planning, PredictsTheBytesHostSwapCopiesOut) {
  TempDir dir;
  run_job(config_for(dir, kGptToPlan, {"--memory.budget=256MiB", "--job.output_dir=" + dir.path("roomy")}), true);
  const auto peak = static_cast<int64_t>(json_number(dir.path("roomy/summary.json"), "mem_peak_bytes"));
  for (const char* policy : {"swap", "hybrid"}) {
    const std::string out = dir.path(policy);
    run_job(config_for(dir, kGptToPlan, {"--memory.budget=" + std::to_string(peak * 6 / 10), std::string("--memory.policy=") + policy,
                                         "--memory.check_fit=false", "--metrics.log_interval=1", "--job.output_dir=" + out}),
            true);
    const double predicted = json_number(out + "/summary.json", "predicted_swap_out_bytes");
    const double measured = last_train_number(out + "/metrics.jsonl", "swap_out_bytes");
    std::printf("%s: %.0f bytes out predicted, %.0f measured\n", policy, predicted, measured);
    ASSERT_GT(measured, 0) << policy;
    if (std::string(policy) == "swap") {
      EXPECT_NEAR(predicted / measured, 1.0, 0.15);
    } else {
      // hybrid copies what the link finishes before forward ends, by the clock: a count that
      // follows the machine's load, in the run and in the profile alike. Asserted: it predicts one.
      EXPECT_GT(predicted, 0);
    }
    EXPECT_GT(json_number(out + "/summary.json", "predicted_swap_link_ms"), 0) << policy;
  }
}

TEST(PlanCommand, PrintsTheTableAndWritesAPlanThatTrainsAsIs) {
  TempDir dir;
  const std::string job = dir.write("job.toml", kConv), out = dir.path("out");
  const ProcessResult r = run_binary("plan " + job + " --ranks 1 --device-memory 24MiB --job.output_dir=" + out);
  ASSERT_EQ(r.status, 0) << r.output;
  // Trained at every size the search uses (powers of two up to the global batch of 32): none is
  // left to the traces alone (they would be marked).
  for (const char* size : {"\n            1        off", "\n            2        off", "\n            4        off",
                           "\n            8        off", "\n           16        off", "\n           32        off"}) {
    EXPECT_THAT(r.output, HasSubstr(size));
  }
  EXPECT_THAT(r.output, Not(HasSubstr("* memory traced on meta tensors at this size")));
  EXPECT_THAT(r.output, HasSubstr("plans (fastest first):"));
  EXPECT_THAT(r.output, HasSubstr("chosen: 1 rank, micro-batch "));
  EXPECT_THAT(r.output, HasSubstr("at 24.0 MiB"));
  ASSERT_TRUE(std::filesystem::exists(out + "/plan.toml"));
  ASSERT_TRUE(std::filesystem::exists(out + "/plans.jsonl"));
  // The plan trains as is, within its budget.
  const ProcessResult train = run_binary(out + "/plan.toml --training.steps=2 --job.output_dir=" + dir.path("trained"));
  ASSERT_EQ(train.status, 0) << train.output;
  EXPECT_LE(json_number(dir.path("trained/summary.json"), "mem_peak_bytes"), 24.0 * (1 << 20));
}

TEST(PlanCommand, PlansForAClusterNotAtHand) {
  TempDir dir;
  const std::string job = dir.write("job.toml", kConv), out = dir.path("out");
  const ProcessResult r =
      run_binary("plan " + job + " --objective cost --cluster.nodes=2 --cluster.devices_per_node=4 "
                 "--cluster.device_memory=1GiB --cluster.device_speed=10 --job.output_dir=" + out);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("[cluster]: 2 node(s) x 4 devices of 1.00 GiB"));
  EXPECT_THAT(r.output, HasSubstr("plans (cheapest first):"));
  // Eight devices on two nodes: plans of 1, 2, 4 and 8 ranks; the cheapest is one rank (no
  // all-reduce), and the sentence prices the alternative.
  EXPECT_THAT(r.output, HasSubstr("chosen: 1 rank"));
  EXPECT_THAT(r.output, HasSubstr("-rank plan"));
  std::ifstream plans(out + "/plans.jsonl");
  const std::string text((std::istreambuf_iterator<char>(plans)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("\"ranks\": 8"));
}

TEST(PlanCommand, BadInputExitsTwoWritingNothing) {
  TempDir dir;
  const std::string job = dir.write("job.toml", kConv), out = dir.path("out");
  const struct {
    std::string args, message;
  } cases[] = {
      {"--ranks 0", "--ranks 0: '0' is not a count of 1 or more; write a list such as --ranks 1,2,4"},
      {"--stages 2,x", "--stages 2,x: 'x' is not a count of 1 or more; write a list such as --stages 1,2,4"},
      {"--ranks 4..2", "--ranks 4..2: the range is empty"},
      {"--device-memory lots", "--device-memory lots: not a memory size"},
      {"--device-memory 64KiB", "cannot hold model convnet's parameters, gradients and sgd state"},
      {"--objective speed", "--objective"},
      {"--training.stpes=3", "unknown key"},
      {"--cluster.nodes=1 --cluster.device_memory=big", "cluster.device_memory = \"big\" is not a memory size"},
      // Why a tensor-parallel size does not split the model, and which would (issue 64, item 9).
      {"--tensor 2", "--tensor 2: model.name = \"convnet\" has no layers built to split across ranks (only gpt and "
                     "llama do) (sizes that split this model: --tensor 1)"},
  };
  for (const auto& c : cases) {
    const ProcessResult r = run_binary("plan " + job + " " + c.args + " --job.output_dir=" + out);
    EXPECT_EQ(r.status, 2) << c.args << ": " << r.output;
    EXPECT_THAT(r.output, HasSubstr(c.message)) << c.args;
    EXPECT_FALSE(std::filesystem::exists(out)) << c.args << ": nothing may be written";
  }
}

// A tensor-parallel size the heads do not divide: why, and the sizes that would; beside one that
// splits, it is left out with a warning (issue 64, item 9: "no tensor-parallel size to plan splits
// the model").
TEST(PlanCommand, ATensorSizeThatDoesNotSplitTheModelSaysWhyAndWhichWould) {
  TempDir dir;
  const std::string job = std::string(HT_SOURCE_DIR) + "/configs/gpt_tiny.toml --job.output_dir=" + dir.path("out");
  const ProcessResult none = run_binary("plan " + job + " --tensor 3");
  EXPECT_EQ(none.status, 2) << none.output;
  EXPECT_THAT(none.output, HasSubstr("no tensor-parallel size asked splits the model: --tensor 3: model.n_head = 4 is not "
                                     "a multiple of parallel.tensor_parallel = 3: attention splits by heads; choose a "
                                     "tensor_parallel dividing n_head (sizes that split this model: --tensor 1,2,4)"));
  EXPECT_FALSE(std::filesystem::exists(dir.path("out")));
  const ProcessResult some = run_binary("plan " + job + " --tensor 2,3 --ranks 2 --precisions off");
  ASSERT_EQ(some.status, 0) << some.output;
  EXPECT_THAT(some.output, HasSubstr("hybrid_train: warning: left out of the plans: --tensor 3: model.n_head = 4"));
}

// A model whose state fits this host but whose one-sample step does not (here a million-word
// vocabulary's logits over 131072 positions, hundreds of GiB) is refused before a point is
// trained, pointing at --cluster: GPT-2 124M's first point (64 samples of 1024 tokens) once ran
// past 24 GiB and the kernel's OOM killer ended the plan without a word. Where a sample fits, the
// points stop at what the host holds (profile_job: "measured up to N samples").
TEST(PlanCommand, AStepTooLargeForThisHostIsRefusedBeforeItIsTried) {
  TempDir dir;
  const ProcessResult r = run_binary("plan " + std::string(HT_SOURCE_DIR) + "/configs/gpt_tiny.toml --model.block_size=131072 "
                                     "--model.vocab_size=1000000 --data.dataset=synthetic --data.synthetic_samples=64 "
                                     "--data.synthetic_eval_samples=8 --job.output_dir=" + dir.path("out"));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_THAT(r.output, ::testing::ContainsRegex("profiling trains this model here, and one sample's step needs [0-9.]+ GiB "
                                                 "of host memory \\([0-9.]+ [GM]iB free to it\\): plan it for the devices "
                                                 "it will train on with --cluster KIND:NODESxDEVICES"));
  EXPECT_FALSE(std::filesystem::exists(dir.path("out")));
}

// The fit check refuses only budgets the engine cannot train in (issue 64, item 11: gpt_tiny with
// dropout at its fixed bytes plus half its activations, 12.7 MiB, was refused, "not in 95% of it",
// and trained 8 steps with memory.check_fit = false). Each budget runs twice on this machine:
// unchecked (the engine's verdict) and checked; wherever the engine trains, the checked run does
// too. The budgets cross gpt_tiny's edge, where the replay once failed kernels that the engine
// runs again after releasing what they held (run_with_room), and where the arena as the first
// step leaves it stops the second (a warning, not a refusal: the replay sees one step).
TEST(PlanCommand, ABudgetTheEngineTrainsInIsNeverRefused) {
  TempDir dir;
  const std::string job = std::string(HT_SOURCE_DIR) + "/configs/gpt_tiny.toml --model.dropout=0.1 --memory.policy=dtr "
                          "--training.steps=3 --training.eval_interval=0 --job.output_dir=" + dir.path("out");
  int trained = 0;
  for (const char* budget : {"11750000", "12350000", "12800000", "13363576"}) {
    SCOPED_TRACE(budget);
    const ProcessResult engine = run_binary(job + " --memory.budget=" + budget + " --memory.check_fit=false");
    ASSERT_TRUE(engine.status == 0 || engine.status == 2) << engine.output;
    const ProcessResult checked = run_binary(job + " --memory.budget=" + budget);
    if (engine.status == 0) {
      ++trained;
      EXPECT_EQ(checked.status, 0) << "refused, though the engine trains in it: " << checked.output;
    }
  }
  EXPECT_GE(trained, 2) << "the sweep crosses budgets the engine trains in";
}

// A budget below the configured plan's peak: refused with plans that fit, and the first of them,
// tried, fits; strategy = "auto" trains it directly.
TEST(PlanCommand, ARefusalsSuggestionFitsAndAutoTrainsIt) {
  TempDir dir;
  run_job(config_for(dir, kConv, {"--memory.budget=256MiB", "--job.output_dir=" + dir.path("roomy")}), true);
  const auto peak = static_cast<int64_t>(json_number(dir.path("roomy/summary.json"), "mem_peak_bytes"));
  const std::string budget = "--memory.budget=" + std::to_string(peak * 8 / 10);
  std::string refusal;
  try {  // memory.policy = "none": the budget is a hard limit
    run_job(config_for(dir, kConv, {budget, "--memory.policy=none", "--job.output_dir=" + dir.path("refused")}), true);
  } catch (const UserError& e) {
    refusal = e.what();
  }
  EXPECT_THAT(refusal, HasSubstr("does not fit memory.budget"));
  EXPECT_FALSE(std::filesystem::exists(dir.path("refused")));
  std::smatch m;
  ASSERT_TRUE(std::regex_search(refusal, m, std::regex("Plans that fit[^:]*: training.micro_batch_size = ([0-9]+)"
                                                       "(, memory.policy = \"([a-z_]+)\")?")))
      << refusal;
  const std::string micro = m[1], policy = m[3];
  std::vector<std::string> args{budget, "--training.micro_batch_size=" + micro, "--job.output_dir=" + dir.path("fix")};
  args.push_back("--memory.policy=" + (policy.empty() ? std::string("none") : policy));
  run_job(config_for(dir, kConv, args), true);
  EXPECT_LE(json_number(dir.path("fix/summary.json"), "mem_peak_bytes"), peak * 8 / 10);
  run_job(config_for(dir, kConv, {budget, "--parallel.strategy=auto", "--job.output_dir=" + dir.path("auto")}), true);
  EXPECT_LE(json_number(dir.path("auto/summary.json"), "mem_peak_bytes"), peak * 8 / 10);
}

// A budget and no memory.policy: the policy is "auto", which trains the one the planner predicts
// fastest among those that fit at the budget (run_check.h). Roomy, that is no eviction at all;
// at 90% of the peak, an evicting one; the run then stays within the budget.
TEST(Planning, ABudgetAloneTrainsThePolicyPredictedFastest) {
  TempDir dir;
  run_job(config_for(dir, kConv, {"--memory.budget=256MiB", "--memory.policy=none", "--job.output_dir=" + dir.path("roomy")}), true);
  const auto peak = static_cast<int64_t>(json_number(dir.path("roomy/summary.json"), "mem_peak_bytes"));
  {
    Config c = config_for(dir, kConv, {"--memory.budget=256MiB"});
    ASSERT_EQ(c.memory.policy, MemoryPolicy::kAuto) << "the default with a budget";
    RunPlan run = run_plan_of(c);
    const RunPrediction p = check_run_fits(c, run, make_datasets(c), ProcessGrid{});
    EXPECT_EQ(run.memory.policy, MemoryPolicy::kNone) << p.text;
    EXPECT_THAT(p.text, HasSubstr("memory.policy = \"auto\" chose by the predicted step: none "));
  }
  const std::string budget = "--memory.budget=" + std::to_string(peak * 9 / 10);
  {
    Config c = config_for(dir, kConv, {budget});
    RunPlan run = run_plan_of(c);
    const RunPrediction p = check_run_fits(c, run, make_datasets(c), ProcessGrid{});
    EXPECT_TRUE(p.prediction.fits) << p.text;
    EXPECT_TRUE(evicts(run.memory.policy)) << p.text;
    EXPECT_THAT(p.text, HasSubstr("none does not fit"));
  }
  run_job(config_for(dir, kConv, {budget, "--job.output_dir=" + dir.path("auto")}), true);
  EXPECT_LE(json_number(dir.path("auto/summary.json"), "mem_peak_bytes"), peak * 9 / 10);
  // At 80% no policy fits with the optimizer state on the device: auto takes host memory too,
  // hybrid with the state on host, and trains in the budget.
  const std::string tight = "--memory.budget=" + std::to_string(peak * 8 / 10);
  {
    Config c = config_for(dir, kConv, {tight});
    RunPlan run = run_plan_of(c);
    const RunPrediction p = check_run_fits(c, run, make_datasets(c), ProcessGrid{});
    EXPECT_THAT(p.text, HasSubstr("dtr does not fit"));
    EXPECT_THAT(p.text, HasSubstr("optimizer state on host"));
    // A static plan is priced from the profile's measured kernel times (the heuristic's segments
    // follow them): on a machine that was busy while the profile ran it may fit here too (seen
    // once in 2026-12-03's full run at -j2), and then it is the faster choice.
    if (p.text.find("static does not fit") != std::string::npos) {
      EXPECT_EQ(run.memory.policy, MemoryPolicy::kHybrid) << p.text;
      EXPECT_EQ(run.memory.optimizer_state, StatePlace::kHost) << p.text;
    } else {
      EXPECT_TRUE(run.memory.policy == MemoryPolicy::kAuto || run.memory.policy == MemoryPolicy::kHybrid) << p.text;
    }
  }
  run_job(config_for(dir, kConv, {tight, "--job.output_dir=" + dir.path("host")}), true);
  EXPECT_LE(json_number(dir.path("host/summary.json"), "mem_peak_bytes"), peak * 8 / 10);
  // At 60% no candidate trains this micro-batch: refused, naming each candidate and what fits.
  try {
    Config c = config_for(dir, kConv, {"--memory.budget=" + std::to_string(peak * 6 / 10)});
    RunPlan run = run_plan_of(c);
    check_run_fits(c, run, make_datasets(c), ProcessGrid{});
    ADD_FAILURE() << "60% of the peak at this micro-batch must be refused";
  } catch (const UserError& e) {
    EXPECT_THAT(e.what(), HasSubstr("memory.policy = \"auto\" found no policy that trains training.micro_batch_size"));
    EXPECT_THAT(e.what(), HasSubstr("dtr does not fit"));
    EXPECT_THAT(e.what(), HasSubstr("Plans that fit"));
  }
  // Where the planner does not predict the run, a budget alone stays a hard limit.
  EXPECT_EQ(config_for(dir, kConv, {"--memory.budget=256MiB", "--parallel.strategy=auto"}).memory.policy,
            MemoryPolicy::kNone);
}

// memory.policy = "auto" weighs per-block plans, with and without offload to host, each at the
// share fastest_block_keep picks, beside the other policies; whichever its words name fastest is
// the one trained (read back from the run plan: policy, offload, share), and it trains the roomy
// run's model bit for bit within the budget. Which one wins depends on measured kernel times; with
// a fast host link (1000 GB/s) offload usually does (2026-12-04: 23 ms against 25 for the others).
TEST(Planning, AutoWeighsPerBlockPlansAndTrainsTheOneItNamesFastest) {
  TempDir dir;
  const std::vector<std::string> deeper{"--model.n_layer=6", "--model.block_size=64", "--data.synthetic_shape=[64]",
                                        "--memory.host_link_gbps=1000", "--checkpoint.interval=4"};
  auto with = [&](std::vector<std::string> a) {
    a.insert(a.end(), deeper.begin(), deeper.end());
    return a;
  };
  run_job(config_for(dir, kGptToPlan, with({"--memory.policy=none", "--job.output_dir=" + dir.path("roomy")})), true);
  const auto peak = static_cast<int64_t>(json_number(dir.path("roomy/summary.json"), "mem_peak_bytes"));
  const std::string budget = "--memory.budget=" + std::to_string(peak * 7 / 10);
  Config c = config_for(dir, kGptToPlan, with({budget, "--job.output_dir=" + dir.path("auto")}));
  RunPlan run = run_plan_of(c);
  const RunPrediction p = check_run_fits(c, run, make_datasets(c), ProcessGrid{});
  ASSERT_TRUE(p.prediction.fits) << p.text;
  // "<name> <ms> ms" or "<name> does not fit", comma-separated, after the head.
  const std::string head = "chose by the predicted step: ";
  const size_t at = p.text.find(head);
  ASSERT_NE(at, std::string::npos) << p.text;
  const std::string cells = p.text.substr(at + head.size(), p.text.find(';', at) - at - head.size());
  const std::regex cell("(?:^|, )([a-z_ %0-9]+?) ([0-9]+) ms");
  std::map<std::string, int> ms;
  for (std::sregex_iterator it(cells.begin(), cells.end(), cell), end; it != end; ++it) ms[(*it)[1]] = std::stoi((*it)[2]);
  const auto named = [&](const std::string& prefix) {
    for (const auto& [name, t] : ms)
      if (name.rfind(prefix, 0) == 0 && (prefix.find("offload") != std::string::npos || name.find("offload") == std::string::npos))
        return std::optional<std::pair<std::string, int>>({name, t});
    return std::optional<std::pair<std::string, int>>();
  };
  const auto per_block = named("per_block keeping "), offload = named("per_block with offload keeping ");
  ASSERT_TRUE(per_block && offload) << "both per-block candidates are priced: " << cells;
  int fastest = INT32_MAX;
  for (const auto& [name, t] : ms) fastest = std::min(fastest, t);
  std::string trained = choice_name(run.memory.policy);
  if (run.memory.policy == MemoryPolicy::kPerBlock) {
    const bool kept_none = run.memory.block_keep_share == 0;
    char share[32];
    std::snprintf(share, sizeof share, " keeping %.0f%%", 100 * run.memory.block_keep_share);
    trained += std::string(run.memory.block_offload ? " with offload" : "") + share;
    if (run.memory.block_offload && kept_none) {
      EXPECT_EQ(run.memory.stage_block_keep, std::vector<double>{0.0}) << "keeping none on the device";
    }
  }
  if (run.memory.policy == MemoryPolicy::kAuto) trained = "static";
  if (run.memory.policy == MemoryPolicy::kHybrid && run.memory.optimizer_state == StatePlace::kHost) {
    trained += " with the optimizer state on host";
  }
  if (evicts(run.memory.policy) && run.memory.eviction_threshold == 1.0) trained += " evicting down to 100%";
  std::printf("auto trains %s: %s\n", trained.c_str(), cells.c_str());
  ASSERT_TRUE(ms.count(trained)) << "trained " << trained << ", not among " << cells;
  EXPECT_EQ(ms[trained], fastest) << "trained " << trained << ": " << cells;
  run_job(c, true);
  EXPECT_LE(json_number(dir.path("auto/summary.json"), "mem_peak_bytes"), peak * 7 / 10);
  expect_same_model(dir.path("roomy/checkpoints/step_00000004/model.pt"), dir.path("auto/checkpoints/step_00000004/model.pt"));
  // parallel.strategy = "auto": the search offers offload on CPU ranks too; a plan that offloads
  // trains over a host budget (half the host's available memory where the config sets none).
  Config s = config_for(dir, kGptToPlan, with({budget, "--parallel.strategy=auto", "--job.output_dir=" + dir.path("s")}));
  RunPlan searched = run_plan_of(s);
  const RunPrediction sp = check_run_fits(s, searched, make_datasets(s), ProcessGrid{});
  std::printf("parallel.strategy = \"auto\": %s\n", sp.text.c_str());
  if (searched.memory.block_offload) {
    EXPECT_EQ(searched.memory.policy, MemoryPolicy::kPerBlock);
    EXPECT_GT(searched.memory.host_budget_bytes, 0);
    EXPECT_THAT(sp.text, HasSubstr("offloading to host"));
  }
  run_job(s, true);
  EXPECT_LE(json_number(dir.path("s/summary.json"), "mem_peak_bytes"), peak * 7 / 10);
}

// parallel.strategy = "auto" with a policy the search does not consider (swap, hybrid), where no
// plan fits and memory.check_fit = false lets the run go on: the configured policy stays. (Until
// policies were an enum, rank 0 sent the index of the policy in a list of nine names that lacked
// these two, and every rank read one past the list's end.)
TEST(Planning, AutoKeepsAConfiguredPolicyTheSearchDoesNotConsider) {
  TempDir dir;
  for (const char* policy : {"swap", "hybrid"}) {
    Config c = config_for(dir, kConv, {"--parallel.strategy=auto", std::string("--memory.policy=") + policy,
                                       "--memory.budget=64KiB", "--memory.check_fit=false"});
    const DataSplits data = make_datasets(c);
    RunPlan run = run_plan_of(c);
    const RunPrediction p = check_run_fits(c, run, data, ProcessGrid{});
    EXPECT_FALSE(p.prediction.fits) << "64 KiB cannot hold the model";
    EXPECT_EQ(choice_name(run.memory.policy), std::string(policy));
    EXPECT_EQ(run.memory.budget_bytes, 64 << 10);
  }
}

// The planner's policies, the config's names and the trainer's questions come from one enum.
TEST(Planning, EveryMemoryPolicyIsOneNameTheSchemaAcceptsAndThePlannerPredicts) {
  const FieldSpec* field = find_field("memory", "policy");
  ASSERT_NE(field, nullptr);
  EXPECT_EQ(field->choices, choice_names<MemoryPolicy>());
  for (MemoryPolicy p : all_choices<MemoryPolicy>()) {
    EXPECT_EQ(parse_choice<MemoryPolicy>(choice_name(p)), p);
    EXPECT_EQ(eviction_heuristic(p).has_value(), evicts(p)) << choice_name(p);
    EXPECT_FALSE(plans_statically(p) && swaps(p)) << choice_name(p);
  }
}

}  // namespace
}  // namespace ht::test

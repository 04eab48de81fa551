// The planner's profile from steps traced on meta tensors (launcher/planning/trace_profile.h):
// the model's state and each micro-batch's activations are the profiled (trained) run's, to the
// byte; each kernel's work is the model's arithmetic; and `plan --cluster` plans models that
// cannot run here, Llama 3 8B on a node of H100s, in seconds, writing a plan for CUDA ranks.
#include "alloc/cpu_arena.h"
#include "alloc/cpu_device_allocator.h"
#include "alloc/gradient_buffer.h"
#include "launcher/config/config_loader.h"
#include "launcher/data/dataset.h"
#include "launcher/model_factory.h"
#include "launcher/planning/meta_trace.h"
#include "launcher/planning/profiler.h"
#include "launcher/planning/device_catalog.h"
#include "launcher/planning/trace_profile.h"
#include "launcher/planning/job_plan.h"
#include "planner/cost_model.h"
#include "planner/weight_copy_terms.h"
#include "parallel/communicator.h"
#include "parallel/data_parallel.h"
#include "tests/support/run_binary.h"
#include "tests/support/temp_dir.h"

#include <gmock/gmock.h>

#include <fstream>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

namespace ht::test {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const char* kTracedLlama = R"([model]
name = "llama"
n_layer = 2
n_head = 4
n_kv_heads = 2
n_embd = 64
block_size = 32
[data]
dataset = "synthetic"
[training]
global_batch_size = 4
optimizer = "adamw"
)";

// The built-in catalog's H100 SXM at the measured curves.
DeviceRates h100_rates() { return device_rates(catalog_kind("h100-sxm", "", "test_trace_profile")); }

// The measured profile trains the model (launcher/planning/profiler.h); the traced one never
// runs a kernel. Their model state is the same to the byte, and so is every micro-batch's
// forward and backward peak above it: the trace sees every block the trainer allocates. The
// optimizer's temporaries are its later steps' (the first makes the state among them).
TEST(TraceProfile, StateAndActivationsAreTheProfiledRunsToTheByte) {
  TempDir dir;
  const Config c = config_for(dir, kTracedLlama, {});
  const DataSplits data = make_datasets(c);
  ProfileRequest measured_request;
  measured_request.largest_micro_batch = 4;
  const ModelProfile measured = profile_job(c, *data.train, data.info, measured_request);
  TraceRequest traced_request;
  traced_request.precisions = {MixedPrecision::kOff};
  traced_request.micro_batches = {1, 4};
  traced_request.rates = h100_rates();
  traced_request.fused_optimizer = true;  // the measured run's optimizer: this CPU's fused pass
  const ModelProfile traced = trace_profile(c, data.info, traced_request);
  EXPECT_EQ(traced.parameters, measured.parameters);
  EXPECT_EQ(traced.parameter_bytes, measured.parameter_bytes);
  EXPECT_EQ(traced.block_parameter_bytes, measured.block_parameter_bytes);
  EXPECT_EQ(traced.gradient_bytes, measured.gradient_bytes);
  EXPECT_EQ(traced.optimizer_state_bytes, measured.optimizer_state_bytes);
  EXPECT_EQ(traced.buckets, measured.buckets);
  EXPECT_EQ(traced.block_buckets, measured.block_buckets);
  EXPECT_EQ(traced.block_bucket_uses, measured.block_bucket_uses);
  EXPECT_EQ(traced.input_sample_bytes, measured.input_sample_bytes);
  EXPECT_EQ(traced.target_sample_bytes, measured.target_sample_bytes);
  ASSERT_EQ(traced.points.size(), 2u);
  for (const ProfilePoint& t : traced.points) {
    const ProfilePoint* m = nullptr;
    for (const ProfilePoint& p : measured.points)
      if (p.micro_batch == t.micro_batch && p.precision == t.precision && p.threads == measured.threads) m = &p;
    ASSERT_NE(m, nullptr) << "measured points: micro-batch " << measured.points.front().micro_batch << " and "
                          << measured.points.back().micro_batch;
    SCOPED_TRACE("micro-batch " + std::to_string(t.micro_batch));
    EXPECT_EQ(t.activation_bytes(), m->activation_bytes());
    // The optimizer's temporaries, but two of ATen's wrapped scalars (64-byte blocks) on data.
    EXPECT_LE(t.optimizer_working_bytes(), m->optimizer_working_bytes());
    EXPECT_LE(m->optimizer_working_bytes() - t.optimizer_working_bytes(), 2 * 64);
    EXPECT_EQ(t.backward_read_buckets, m->backward_read_buckets);
    // What 16-bit gathers would gather: the buckets with a cast weight, the weights read in fp32.
    EXPECT_EQ(t.half_read_buckets, m->half_read_buckets);
    EXPECT_EQ(t.backward_copy_buckets, m->backward_copy_buckets);
    EXPECT_EQ(t.backward_fp32_buckets, m->backward_fp32_buckets);
    EXPECT_EQ(t.fp32_read_elements, m->fp32_read_elements);
    EXPECT_EQ(t.trace.kernels.size(), m->trace.kernels.size());
    EXPECT_EQ(t.graph.forward.size(), m->graph.forward.size());
    EXPECT_EQ(t.block_starts, m->block_starts);
    EXPECT_GT(t.forward_backward_ms, 0);
  }
}

// Beyond two traced sizes the profile derives its points: every tensor's bytes and kernel's work
// on the line through the two traces. A derived point is the traced one (a small Llama in bf16
// at 512 tokens): its activations to the byte, every kernel's work and the time to rounding error.
TEST(TraceProfile, ADerivedPointIsTheTracedOne) {
  TempDir dir;
  Config c = config_for(dir, kTracedLlama, {"--model.n_layer=2", "--model.n_embd=256", "--model.n_head=8",
                                            "--model.block_size=512", "--training.mixed_precision=bf16"});
  const DataInfo info{Task::kLanguageModel, {512}, 96, "tokens", 0};
  TraceRequest request;
  request.rates = h100_rates();
  request.micro_batches = {1, 2, 8};
  const ModelProfile derived = trace_profile(c, info, request);
  request.micro_batches = {8, 1};
  const ModelProfile traced = trace_profile(c, info, request);
  const ProfilePoint& d = derived.points.back();
  const ProfilePoint& t = traced.points.front();
  ASSERT_EQ(d.micro_batch, 8);
  ASSERT_EQ(t.micro_batch, 8);
  EXPECT_EQ(d.activation_bytes(), t.activation_bytes());  // no tensor here rounds off the line
  EXPECT_NEAR(d.forward_backward_ms, t.forward_backward_ms, 1e-9 * t.forward_backward_ms);
  ASSERT_EQ(d.trace.kernels.size(), t.trace.kernels.size());
  for (size_t k = 0; k < t.trace.kernels.size(); ++k) {
    ASSERT_NEAR(d.trace.kernels[k].flops, t.trace.kernels[k].flops, 1e-6 * (1 + t.trace.kernels[k].flops)) << k;
    ASSERT_NEAR(d.trace.kernels[k].bytes, t.trace.kernels[k].bytes, 1e-6 * (1 + t.trace.kernels[k].bytes)) << k;
  }
}

// Kept 16-bit weight copies in the cost model: the traced step's weight casts (forward casts that
// read no activation) run once a step instead of once a micro-batch, their gradients' casts not at
// all, and the copies (2 bytes per weight cast) sit beside the optimizer step's temporaries; a
// budget that evicts casts instead, and so does a plan the copies would not fit.
TEST(TraceProfile, KeptWeightCopiesSaveEveryMicroBatchsCastsButOne) {
  TempDir dir;
  Config c = config_for(dir, kTracedLlama, {"--model.n_embd=256", "--model.n_head=8", "--model.block_size=512",
                                            "--training.mixed_precision=bf16"});
  const DataInfo info{Task::kLanguageModel, {512}, 96, "tokens", 0};
  TraceRequest request;
  request.rates = h100_rates();
  request.micro_batches = {1};
  const ModelProfile profile = trace_profile(c, info, request);
  const Machine machine = machine_for(c, PlanArgs{}, 1);
  Plan kept;
  kept.micro_batch = 1;
  kept.accumulation = 8;
  kept.precision = MixedPrecision::kBf16;
  Plan cast = kept;
  cast.compute_weights = ComputeWeightsMode::kCast;
  ASSERT_TRUE(keeps_weight_copies(kept));
  ASSERT_FALSE(keeps_weight_copies(cast));
  const WeightCasts w = weight_casts(profile, MixedPrecision::kBf16, kept.micro_batch);
  // Every weight but the embedding's table (96 x 256) and the norms' gains (2 a layer, the last):
  // the products' and the head's, 2 bytes each.
  const int64_t weights = profile.parameter_bytes / 4;
  EXPECT_EQ(w.copy_bytes, 2 * (weights - 96 * 256 - 5 * 256));
  EXPECT_GT(w.forward_ms, 0.0);
  EXPECT_GT(w.backward_ms, 0.0);
  const Prediction pk = predict(profile, machine, kept), pc = predict(profile, machine, cast);
  EXPECT_NEAR(pc.compute_ms - pk.compute_ms, (w.forward_ms + w.backward_ms) * 8 - w.forward_ms,
              1e-9 * pc.compute_ms);
  EXPECT_EQ(pk.weight_copy_bytes, w.copy_bytes);
  // The step without the casts and their fp32 gradients, the copies resident beside it all step.
  EXPECT_EQ(pk.activation_bytes, pc.activation_bytes + activations_without_casts_change(profile, kept));
  EXPECT_LT(pk.activation_bytes, pc.activation_bytes);
  EXPECT_EQ(pk.optimizer_working_bytes, pc.optimizer_working_bytes);
  EXPECT_EQ(pk.peak_bytes, pk.working_peak_bytes() + w.copy_bytes);
  Plan budget = kept;
  budget.policy = MemoryPolicy::kDtr;
  budget.budget_bytes = int64_t{1} << 40;
  EXPECT_FALSE(keeps_weight_copies(budget)) << "a budget that evicts: casts the memory manager may drop";
  budget.policy = MemoryPolicy::kNone;
  EXPECT_TRUE(keeps_weight_copies(budget)) << "a budget that never evicts (a device's plan): kept";
  budget.policy = MemoryPolicy::kFull;
  budget.budget_bytes = 0;
  EXPECT_TRUE(keeps_weight_copies(budget)) << "full recomputation without one reads the kept copies again";
  ASSERT_TRUE(weight_cast_twin(kept).has_value());
  EXPECT_EQ(weight_cast_twin(kept)->compute_weights, ComputeWeightsMode::kCast);
  Plan asked = kept;
  asked.compute_weights = ComputeWeightsMode::kKept;
  EXPECT_FALSE(weight_cast_twin(asked).has_value()) << "asked for: the search keeps it";
}

// Each traced kernel's work is the model's arithmetic: Llama 3 8B's forward at one sequence of
// 8192 tokens is 2 flops per weight of its contractions per token, plus causal attention's
// 2 T^2 h per layer (q k^T and P v over the keys up to each query), exactly; backward twice the
// contractions' and 2.5 times attention's.
TEST(TraceProfile, LlamaThreeEightBsTracedWorkIsItsArithmetic) {
  Config c = load_config(std::string(HT_SOURCE_DIR) + "/configs/llama3_8b.toml", {}).config;
  const DataInfo info{Task::kLanguageModel, {c.model.block_size}, c.model.vocab_size, "tokens", 0};
  c.training.mixed_precision = MixedPrecision::kBf16;
  const TracedStep step = trace_micro_batch(c, info, 1);
  const double T = 8192, h = 4096, f = 14336, V = 128256, L = 32, kv = 8 * 128;
  const double weights = L * (h * (h + 2 * kv) + h * h + 3 * h * f) + h * V;
  const double attention = L * 2 * T * T * h;
  double forward = 0, backward = 0, contractions_in_bf16 = 0, contractions = 0;
  for (const TraceKernel& k : step.trace.kernels) {
    (k.backward ? backward : forward) += k.flops;
    if (!k.backward && k.flops > 0) {
      ++contractions;
      contractions_in_bf16 += k.type == KernelType::kBf16;
    }
  }
  EXPECT_DOUBLE_EQ(forward, 2 * weights * T + attention);
  EXPECT_DOUBLE_EQ(backward, 2 * 2 * weights * T + 2.5 * attention);
  EXPECT_EQ(contractions_in_bf16, contractions) << "under bf16 autocast every contraction runs in bf16";
}

// `plan --cluster`: Llama 3 8B (120 GiB of state with AdamW) on one node of 8 H100s is planned
// from traces in seconds, every tensor-parallel size and stage count searched; the plan fits
// without recomputation, and is written for 8 CUDA ranks. On one H100 nothing fits: exit 2,
// naming the smallest cluster that does (two, with DTR: eviction is searched where nothing fits
// without it).
TEST(TraceProfile, PlanLlamaThreeEightBOnANodeOfH100s) {
  TempDir dir;
  const std::string config = std::string(HT_SOURCE_DIR) + "/configs/llama3_8b.toml --job.output_dir=" + dir.path("plan");
  const ProcessResult r = run_binary("plan " + config + " --cluster h100-sxm:1x8");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("traced on meta tensors, priced at the device's rates"));
  EXPECT_THAT(r.output, HasSubstr("a cluster of NVIDIA H100 SXM5 80GB: "));
  EXPECT_THAT(r.output, HasSubstr("chosen: 8 ranks"));
  EXPECT_THAT(r.output, HasSubstr("time by op: linear backward"));  // contractions dominate, backward twice
  EXPECT_THAT(r.output, HasSubstr("tokens/s  device-h/Gtok"));
  // Each layout's memory/time frontier (issue 66): the chosen one's from none to full, and the
  // best recomputing plan's per-block plan by kind of tensor, attention's outputs kept whole.
  // The chosen layout's frontier: its header, the column names, then none's row and full's.
  EXPECT_TRUE(std::regex_search(r.output, std::regex("memory/time frontier of the chosen layout:\n.*\n  none +[0-9.]+ +"
                                                     "[0-9.]+ +1\\.00 +yes\n  full +[0-9.]+ +[0-9.]+ +[0-9]+\\.[0-9]+ +yes\n")))
      << r.output;
  EXPECT_THAT(r.output, HasSubstr("per_block in the best recomputing plan:"));
  EXPECT_TRUE(std::regex_search(r.output, std::regex("\n  attention +2 +([0-9.]+) +2 +\\1 "))) << r.output;
  std::ifstream in(dir.path("plan") + "/plan.toml");
  std::stringstream plan;
  plan << in.rdbuf();
  EXPECT_THAT(plan.str(), HasSubstr("# Train it: mpirun -np 8 hybrid_train"));
  EXPECT_THAT(plan.str(), HasSubstr("device = \"cuda\""));
  EXPECT_THAT(plan.str(), HasSubstr("device = \"h100-sxm\""));
  const ProcessResult one = run_binary("plan " + config + " --cluster h100-sxm:1x1");
  EXPECT_EQ(one.status, 2) << one.output;
  EXPECT_THAT(one.output, HasSubstr("no plan fits 1 device(s)"));
  // Two H100s hold its state split in two; one sequence's activations then need recomputation:
  // every layer's, as Megatron's full recomputation (memory.policy = "full").
  EXPECT_THAT(one.output, HasSubstr("the smallest cluster of this kind that fits it: --cluster h100-sxm:1x2"));
  // Its arena is the device less what the CUDA context and the tensor-parallel group's NCCL
  // communicator hold: 74.5 GiB less 1 GiB and 700 MiB. (Which state the two shard depends on
  // the time model: since attention is priced as Hopper runs flash, sharding all of it.)
  EXPECT_THAT(one.output, HasSubstr("bf16, full"));
  EXPECT_THAT(one.output, HasSubstr("at 72.8 GiB)"));
}

// GPT-2's 50,257-word output layer is off the tensor cores' alignment (7.4x slower on an H200):
// plan says what share of the step it is and what padding the vocabulary would save; padded, no note.
TEST(TraceProfile, PlanNotesAMisalignedVocabularyAndWhatPaddingSaves) {
  TempDir dir;
  const std::string config = std::string(HT_SOURCE_DIR) + "/configs/gpt2_124m.toml --model.n_layer=2 --cluster h200:1x1";
  const ProcessResult odd = run_binary("plan " + config + " --job.output_dir=" + dir.path("odd"));
  ASSERT_EQ(odd.status, 0) << odd.output;
  EXPECT_THAT(odd.output, HasSubstr("16-bit products with a dimension that is not a multiple of 8"));
  EXPECT_THAT(odd.output, HasSubstr("model.vocab_size = 50257 is the odd one: --model.vocab_size=50304"));
  const ProcessResult padded = run_binary("plan " + config + " --model.vocab_size=50304 --job.output_dir=" + dir.path("padded"));
  ASSERT_EQ(padded.status, 0) << padded.output;
  EXPECT_THAT(padded.output, Not(HasSubstr("not a multiple of 8"))) << padded.output;
}

// Full recomputation on a cluster's devices: its regenerations cost time, never less than none,
// at every size the search prices from its two smallest replays (issue 64: GPT-2 124M at
// tensor_parallel 2 printed -5.2 ms, the line through sizes 1 and 2, whose kernels run at the
// efficiency curve's low end, extrapolated to 128).
TEST(TraceProfile, FullRecomputationCostsTimeAtEverySize) {
  TempDir dir;
  const ProcessResult r = run_binary("plan " + std::string(HT_SOURCE_DIR) + "/configs/gpt2_124m.toml --cluster h100-sxm:1x8 "
                                     "--tensor 1,2 --all --job.output_dir=" + dir.path("plan"));
  ASSERT_EQ(r.status, 0) << r.output;
  std::ifstream in(dir.path("plan/plans.jsonl"));
  int full = 0;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json plan = nlohmann::json::parse(line);
    SCOPED_TRACE(line.substr(0, 300));
    EXPECT_GE(plan.at("recompute_ms").get<double>(), 0.0);
    if (plan.at("policy") == "full") {
      ++full;
      // Regenerating every block's forward: more than nothing, less than forward and backward.
      EXPECT_GT(plan.at("recompute_ms").get<double>(), 0.0);
      EXPECT_LT(plan.at("recompute_ms").get<double>(), plan.at("compute_ms").get<double>());
    }
  }
  EXPECT_GT(full, 10) << "plans of full recomputation at several sizes and layouts";
}

// A graph that changes every step (the supernet draws a path from the interpreter's seeds) is
// traced for its first 16 steps, drawn as the trainer draws them, and planned for the highest:
// the traced point's activations are the highest of the same 16 steps run on data (this CPU's
// kernel workspaces declared, channels-last, the trainer's gradient block), and above the first
// step's alone.
TEST(TraceProfile, AGraphThatChangesEveryStepIsPlannedForItsHeaviestPath) {
  TempDir dir;
  const Config c = config_for(dir, R"([model]
name = "supernet"
num_blocks = 4
[data]
dataset = "synthetic"
synthetic_shape = [3, 16, 16]
[training]
global_batch_size = 4
)", {});
  const DataInfo info{Task::kClassification, {3, 16, 16}, 10, "images", 0};
  TraceRequest request;
  request.precisions = {MixedPrecision::kOff};
  request.micro_batches = {4};
  request.workspaces = WorkspaceRules::kThisCpu;
  const ModelProfile traced = trace_profile(c, info, request);
  ASSERT_EQ(traced.points.size(), 1u);

  const auto arena = std::make_shared<CpuArena>(int64_t{1} << 32);
  const ArenaScope scope(arena);
  at::manual_seed(c.job.seed);
  const std::shared_ptr<Model> model = make_model(c, info, /*tensor_rank=*/0);
  model->use_channels_last();
  const GradientBuffer gradients(
      DataParallel(std::make_shared<LocalCommunicator>(), model->parameters(), c.parallel.bucket_mb << 20).reduction_order());
  const DeclaredWorkspaces declared(WorkspaceRules::kThisCpu);
  std::vector<int64_t> peaks;
  TraceExtras extras;
  extras.gradients = &gradients;
  for (int step = 0; step < 16; ++step) {
    TracedStep out;
    const auto [x, y] = traced_batch(info, 4, /*meta=*/false);
    trace_forward_backward(c, *model, arena, x, y, out, &extras);  // carries the seed counter
    peaks.push_back(out.step_peak_bytes);
  }
  EXPECT_EQ(traced.points[0].activation_bytes(), *std::max_element(peaks.begin(), peaks.end()));
  EXPECT_GT(traced.points[0].activation_bytes(), peaks.front()) << "the first step's path is not the heaviest";
}

// A cluster whose nodes' host memory is described (cluster.host_memory): per_block's offload to
// host is searched on its GPUs too (their host link has copy streams), each rank with its share of
// a node's memory; without it, none is.
TEST(TraceProfile, AClusterWithHostMemoryIsSearchedForOffloadToHost) {
  TempDir dir;
  const std::vector<std::string> cluster{"--cluster.nodes=1", "--cluster.device=h100-sxm", "--cluster.devices_per_node=4"};
  std::vector<std::string> described = cluster;
  described.push_back("--cluster.host_memory=1TiB");
  const DataInfo info{Task::kLanguageModel, {32}, 96, "tokens", 0};
  PlanArgs args;
  args.ranks = {1};
  args.policies = {MemoryPolicy::kNone, MemoryPolicy::kPerBlock};
  args.shards = {ShardLevel::kNone};
  args.trained_sizes = {4};
  const auto offloads = [&](const JobPlan& plan) {
    return std::count_if(plan.ranked.begin(), plan.ranked.end(), [](const RankedPlan& r) { return r.plan.block_offload; });
  };
  // Memory for the plain plan less half its activations: per_block plans are needed, and kept.
  const JobPlan roomy = plan_job(config_for(dir, kTracedLlama, cluster), nullptr, info, args);
  ASSERT_FALSE(roomy.ranked.empty());
  const Prediction& plain = roomy.ranked[0].prediction;
  ASSERT_EQ(roomy.ranked[0].plan.policy, MemoryPolicy::kNone);
  args.device_memory = plain.peak_bytes + roomy.machine.reserved_bytes(false, false, false) - plain.activation_bytes / 2;
  const JobPlan with = plan_job(config_for(dir, kTracedLlama, described), nullptr, info, args);
  EXPECT_EQ(with.machine.host_memory, (int64_t{1} << 40) / 4);
  EXPECT_GT(offloads(with), 0);
  const JobPlan without = plan_job(config_for(dir, kTracedLlama, cluster), nullptr, info, args);
  EXPECT_EQ(without.machine.host_memory, 0);
  EXPECT_EQ(offloads(without), 0);
}

}  // namespace
}  // namespace ht::test

// Every kind of bad config gives one message naming file:line:column (or the argument), the
// key, the bad value and what is allowed.
#include "tests/support/temp_dir.h"

#include "launcher/config/config_validation.h"
#include "launcher/config/run_plan_of.h"
#include "base/user_error.h"
#include "alloc/byte_size.h"

#include <ATen/Context.h>

namespace ht::test {
namespace {

using ::testing::HasSubstr;

const char* kGood = R"(
[model]
name = "mlp"
[data]
dataset = "synthetic"
)";

class ConfigErrors : public ::testing::Test {
 protected:
  std::string error_in(const std::string& toml, const std::vector<std::string>& args = {}) {
    std::vector<ConfigOverride> overrides;
    for (const auto& a : args) overrides.push_back(override_of(a));
    return load_error(dir_.write("job.toml", toml), overrides);
  }
  TempDir dir_;
};

TEST_F(ConfigErrors, GoodConfigLoads) { EXPECT_EQ(error_in(kGood), ""); }

TEST_F(ConfigErrors, UnknownSectionSuggestsNearest) {
  const std::string e = error_in(std::string(kGood) + "[trainig]\nsteps = 5\n");
  EXPECT_THAT(e, HasSubstr("job.toml:6:2: unknown section [trainig]; did you mean [training]?"));
}

TEST_F(ConfigErrors, UnknownKeySuggestsNearest) {
  const std::string e = error_in(std::string(kGood) + "[training]\nstpes = 5\n");
  EXPECT_THAT(e, HasSubstr("job.toml:7:1: unknown key training.stpes; did you mean training.steps?"));
}

TEST_F(ConfigErrors, KeyOutsideSection) {
  EXPECT_THAT(error_in(std::string("steps = 5\n") + kGood),
              HasSubstr("job.toml:1:1: key 'steps' must be inside a section; did you mean training.steps"));
}

TEST_F(ConfigErrors, WrongType) {
  EXPECT_THAT(error_in(std::string(kGood) + "[training]\nsteps = \"five\"\n"),
              HasSubstr("job.toml:7:9: training.steps: expected an integer, got a string (\"five\")"));
  EXPECT_THAT(error_in(std::string(kGood) + "[training]\nsteps = 2.5\n"),
              HasSubstr("training.steps: expected an integer, got a number"));
  EXPECT_THAT(error_in(std::string(kGood) + "[model]\n"), HasSubstr("TOML syntax error"));  // redefined table
  EXPECT_THAT(error_in(R"([model]
name = "mlp"
hidden = [64, "wide"]
[data]
dataset = "synthetic"
)"),
              HasSubstr("job.toml:3:10: model.hidden: expected a list of integers, but an element is a string"));
}

TEST_F(ConfigErrors, OutOfRange) {
  EXPECT_THAT(error_in(std::string(kGood) + "[training]\nsteps = -5\n"),
              HasSubstr("job.toml:7:9: training.steps: -5 is out of range: must be >= 0"));
  EXPECT_THAT(error_in(R"([model]
name = "mlp"
dropout = 1.5
[data]
dataset = "synthetic"
)"),
              HasSubstr("job.toml:3:11: model.dropout: 1.5 is out of range: must be <= 0.99"));
}

TEST_F(ConfigErrors, MissingRequiredValue) {
  EXPECT_THAT(error_in("[data]\ndataset = \"synthetic\"\n"),
              HasSubstr("job.toml: model.name is required: one of \"mlp\" \"convnet\" \"resnet\" \"gpt\" \"supernet\""));
  EXPECT_THAT(error_in("[model]\nname = \"mlp\"\n"), HasSubstr("data.dataset is required"));
}

TEST_F(ConfigErrors, UnknownModelSuggestsNearest) {
  EXPECT_THAT(error_in("[model]\nname = \"resnt\"\n[data]\ndataset = \"synthetic\"\n"),
              HasSubstr("job.toml:2:8: model.name: \"resnt\" is not allowed; expected one of \"mlp\" \"convnet\" "
                        "\"resnet\" \"gpt\" \"supernet\" \"llama\" (did you mean \"resnet\"?)"));
}

TEST_F(ConfigErrors, TomlSyntaxError) {
  EXPECT_THAT(error_in("[model\nname = \"mlp\"\n"), HasSubstr("job.toml:1:7: TOML syntax error:"));
}

TEST_F(ConfigErrors, UnreadableConfigFile) {
  EXPECT_THAT(load_error(dir_.path("missing.toml")),
              HasSubstr("missing.toml: cannot read the config file (does it exist? try configs/quickstart.toml)"));
}

// Pipeline keys: a schedule that does not exist is refused; a pipeline key without stages is said
// to do nothing. (What needs the ranks, pipeline_parallel against -np, is tested under mpirun.)
TEST_F(ConfigErrors, PipelineKeys) {
  EXPECT_THAT(error_in(kGood, {"--parallel.pipeline_parallel=2", "--parallel.pipeline_schedule=zb_h2"}),
              HasSubstr("\"zb_h2\" is not allowed"));
  EXPECT_THAT(error_in(kGood, {"--parallel.pipeline_parallel=2", "--parallel.pipeline_p2p=nccl"}),
              HasSubstr("\"nccl\" is not allowed"));
  EXPECT_THAT(error_in(kGood, {"--parallel.pipeline_parallel=0"}), HasSubstr("parallel.pipeline_parallel"));
  const LoadedConfig loaded =
      load_config(dir_.write("p.toml", kGood), {override_of("--parallel.virtual_stages=2")});
  ASSERT_EQ(loaded.warnings.size(), 1u);
  EXPECT_THAT(loaded.warnings[0], HasSubstr("parallel.virtual_stages has no effect: it applies only when "
                                            "parallel.pipeline_parallel > 1"));
  // With the grid known (as main() applies it): what the micro-batches and the policy allow.
  auto refusal = [&](std::vector<std::string> args, int64_t replicas) {
    std::vector<ConfigOverride> overrides;
    for (const std::string& a : args) overrides.push_back(override_of(a));
    LoadedConfig c = load_config(dir_.write("q.toml", kGood), overrides);
    try {
      ProcessGrid grid;
      grid.world = grid.data_parallel = static_cast<int>(replicas);
      run_plan_of(c.config, grid);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_THAT(refusal({"--parallel.pipeline_parallel=2", "--parallel.virtual_stages=2"}, 1),
              HasSubstr("virtual_stages > 1 is only for interleaved_1f1b"));
  EXPECT_THAT(refusal({"--parallel.pipeline_parallel=4", "--parallel.pipeline_schedule=interleaved_1f1b",
                       "--parallel.virtual_stages=2", "--training.micro_batch_size=0"}, 1),
              HasSubstr("interleaved_1f1b needs micro-batches to be a multiple of the 4 stages"));
  EXPECT_THAT(refusal({"--parallel.pipeline_parallel=2", "--memory.policy=static", "--memory.budget=1GiB"}, 1),
              HasSubstr("use memory.policy = \"dtr\""));
  EXPECT_THAT(refusal({"--parallel.pipeline_parallel=2", "--parallel.strategy=auto"}, 1),
              HasSubstr("the planner does not search pipeline stages yet"));
  EXPECT_EQ(refusal({"--parallel.pipeline_parallel=2"}, 1), "(accepted)");
}

TEST_F(ConfigErrors, MixedPrecision) {
  EXPECT_THAT(error_in(kGood, {"--training.mixed_precision=fp16"}),
              HasSubstr("argument --training.mixed_precision=fp16: training.mixed_precision = \"fp16\" on "
                        "training.device = \"cpu\": ATen lacks most fp16 CPU kernels; use \"bf16\" on the CPU, or "
                        "fp16 with training.device = \"cuda\""));
  EXPECT_THAT(error_in(kGood, {"--training.mixed_precision=fp8"}), HasSubstr("\"fp8\" is not allowed"));
  EXPECT_THAT(error_in(kGood, {"--training.loss_scale=0.5"}), HasSubstr("training.loss_scale: 0.5 is out of range"));
  // bf16 needs no loss scaling: a scaling key with it is said to do nothing, and why.
  const LoadedConfig loaded = load_config(dir_.write("s.toml", kGood), {override_of("--training.mixed_precision=bf16"),
                                                                        override_of("--training.loss_scale=1024")});
  ASSERT_EQ(loaded.warnings.size(), 1u);
  EXPECT_THAT(loaded.warnings[0], HasSubstr("training.loss_scale has no effect: it applies only when "
                                            "training.mixed_precision = \"fp16\" (bf16 has fp32's exponent range "
                                            "and needs no loss scaling)"));
}

// Kept 16-bit weight copies are resident all step: not with a static plan (solved over the first
// step, whose casts the copies replace); without 16 bits they do nothing. Under sharded parameters
// they are the shards' copies, gathered where read (parallel/parameter_shards.h).
TEST_F(ConfigErrors, ComputeWeights) {
  const std::vector<std::string> kept{"--training.mixed_precision=bf16", "--training.compute_weights=kept"};
  auto with = [&](std::vector<std::string> args, const std::string& more) {
    args.push_back(more);
    return error_in(kGood, args);
  };
  EXPECT_NO_THROW(load_config(dir_.write("z3.toml", kGood), {override_of(kept[0]), override_of(kept[1]),
                                                             override_of("--parallel.shard=parameters")}));
  const std::string static_words = "use training.compute_weights = \"cast\" (or \"auto\"), or memory.policy = \"dtr\"";
  EXPECT_THAT(with({kept[0], kept[1], "--memory.budget=64MiB"}, "--memory.policy=static"), HasSubstr(static_words));
  // A budget alone sets memory.policy = "auto": static plans too.
  EXPECT_THAT(with(kept, "--memory.budget=64MiB"), HasSubstr(static_words));
  EXPECT_THAT(with(kept, "--training.compute_weights=copied"), HasSubstr("\"copied\" is not allowed"));
  const LoadedConfig loaded = load_config(dir_.write("w.toml", kGood), {override_of("--training.compute_weights=kept")});
  ASSERT_EQ(loaded.warnings.size(), 1u);
  EXPECT_THAT(loaded.warnings[0], HasSubstr("training.compute_weights has no effect"));
}

TEST_F(ConfigErrors, OptimizerStateDtype) {
  EXPECT_THAT(error_in(kGood, {"--training.optimizer=adamw", "--training.optimizer_state_dtype=fp8"}),
              HasSubstr("\"fp8\" is not allowed"));
  const LoadedConfig loaded =
      load_config(dir_.write("w.toml", kGood), {override_of("--training.optimizer_state_dtype=bf16")});
  ASSERT_EQ(loaded.warnings.size(), 1u) << "kGood trains with SGD";
  EXPECT_THAT(loaded.warnings[0], HasSubstr("training.optimizer_state_dtype has no effect"));
}

// training.gradient_dtype: a type it knows, and a word where it changes nothing (fp16, fp32 runs).
TEST_F(ConfigErrors, GradientDtype) {
  EXPECT_THAT(error_in(kGood, {"--training.mixed_precision=bf16", "--training.gradient_dtype=fp16"}),
              HasSubstr("\"fp16\" is not allowed"));
  const LoadedConfig loaded = load_config(dir_.write("w.toml", kGood), {override_of("--training.gradient_dtype=bf16")});
  ASSERT_EQ(loaded.warnings.size(), 1u) << "kGood trains in fp32";
  EXPECT_THAT(loaded.warnings[0], HasSubstr("training.gradient_dtype has no effect"));
}

TEST_F(ConfigErrors, PerBlockKeep) {
  const std::vector<std::string> per_block{"--memory.policy=per_block", "--memory.budget=64MiB"};
  for (const char* bad : {"lots", "-3MiB", "0x", "150%"}) {
    std::vector<std::string> args = per_block;
    args.push_back(std::string("--memory.block_keep=") + bad);
    EXPECT_THAT(error_in(kGood, args),
                HasSubstr(std::string("memory.block_keep = \"") + bad + "\" is not a memory size or a share; use bytes"))
        << bad;
  }
  // One share per pipeline stage: shares only ("0%" is a stage's full recomputation), one a stage.
  std::vector<std::string> staged = per_block;
  staged.push_back("--parallel.pipeline_parallel=2");
  for (const char* bad : {"25%,12MiB", "25%,", "-5%,50%", "25%,150%"}) {
    std::vector<std::string> args = staged;
    args.push_back(std::string("--memory.block_keep=") + bad);
    EXPECT_THAT(error_in(kGood, args), HasSubstr(std::string("memory.block_keep = \"") + bad + "\" is not a memory size"))
        << bad;
  }
  std::vector<std::string> three = staged;
  three.push_back("--memory.block_keep=0%,50%,100%");
  EXPECT_THAT(error_in(kGood, three), HasSubstr("memory.block_keep = \"0%,50%,100%\" names 3 shares, one per pipeline "
                                                "stage, and parallel.pipeline_parallel = 2; give 2 shares"));
  std::vector<std::string> one = per_block;
  one.push_back("--memory.block_keep=0%,50%");
  EXPECT_THAT(error_in(kGood, one), HasSubstr("parallel.pipeline_parallel = 1; give 1 share, or one for every stage"));
  // "0%" (or "0") keeps nothing on the device: full recomputation, or what memory.block_offload offloads.
  for (const char* none : {"0%", "0"}) {
    std::vector<ConfigOverride> overrides{override_of(per_block[0]), override_of(per_block[1]),
                                          override_of(std::string("--memory.block_keep=") + none)};
    const Config c = load_config(dir_.write("none.toml", kGood), overrides).config;
    EXPECT_EQ(stage_block_keep_of(c), std::vector<double>{0.0}) << none;
  }
}

// memory.block_offload: per_block's, with the host link's keys; refused with ZeRO-3 (a gather's
// point would depend on when copies finish) and on a GPU (no CUDA host link yet).
TEST_F(ConfigErrors, PerBlockOffload) {
  const LoadedConfig ignored = load_config(dir_.write("w.toml", kGood), {override_of("--memory.block_offload=true")});
  ASSERT_EQ(ignored.warnings.size(), 1u);
  EXPECT_THAT(ignored.warnings[0], HasSubstr("memory.block_offload has no effect: it applies only when memory.policy = \"per_block\""));
  const std::vector<std::string> offload{"--memory.policy=per_block", "--memory.budget=64MiB", "--memory.block_offload=true"};
  std::vector<ConfigOverride> overrides;
  for (const auto& a : offload) overrides.push_back(override_of(a));
  overrides.push_back(override_of("--memory.host_budget=1GiB"));
  const LoadedConfig loaded = load_config(dir_.write("o.toml", kGood), overrides);
  EXPECT_TRUE(loaded.warnings.empty()) << "memory.host_budget applies: " << loaded.warnings[0];
  EXPECT_EQ(host_budget_bytes_of(loaded.config), int64_t{1} << 30);
  std::vector<std::string> bad = offload;
  bad.push_back("--memory.host_budget=lots");
  EXPECT_THAT(error_in(kGood, bad), HasSubstr("memory.host_budget = \"lots\" is not a memory size"));
  std::vector<std::string> zero3 = offload;
  zero3.push_back("--parallel.shard=parameters");
  EXPECT_THAT(error_in(kGood, zero3), HasSubstr("memory.policy = \"per_block\" and memory.block_offload = true: host swap "
                                                "decides by when copies finish"));
}

TEST_F(ConfigErrors, HostSwap) {
  const std::vector<std::string> hybrid{"--memory.policy=hybrid", "--memory.budget=64MiB"};
  auto with = [&](std::vector<std::string> args, const std::string& more) {
    args.push_back(more);
    return error_in(kGood, args);
  };
  EXPECT_THAT(with(hybrid, "--memory.host_budget=plenty"),
              HasSubstr("argument --memory.host_budget=plenty: memory.host_budget = \"plenty\" is not a memory size; "
                        "use bytes with a unit (\"8GiB\", \"500MB\") or a share of the host's available memory "
                        "(\"50%\")"));
  EXPECT_THAT(with(hybrid, "--memory.host_budget=1000000GiB"),
              HasSubstr("is more than this host's available memory"));
  EXPECT_THAT(with(hybrid, "--memory.host_link_gbps=0"), HasSubstr("memory.host_link_gbps: 0.0 is out of range: must be >= 0.01"));
  EXPECT_THAT(error_in(std::string(kGood) + "[memory]\npolicy = \"swap\"\n"),
              HasSubstr("memory.policy = \"swap\" evicts to fit a budget, and memory.budget is not set"));
  auto host_bytes = [&](const std::vector<std::string>& args) {
    std::vector<ConfigOverride> overrides;
    for (const auto& a : args) overrides.push_back(override_of(a));
    return host_budget_bytes_of(load_config(dir_.write("h.toml", kGood), overrides).config);
  };
  EXPECT_EQ(host_bytes({"--memory.policy=swap", "--memory.budget=64MiB", "--memory.host_budget=2GiB"}), int64_t{2} << 30);
  EXPECT_GT(host_bytes(hybrid), 0) << "the default: half of the available memory";
  const LoadedConfig loaded = load_config(dir_.write("w.toml", kGood), {override_of("--memory.host_link_gbps=8")});
  ASSERT_EQ(loaded.warnings.size(), 1u);
  EXPECT_THAT(loaded.warnings[0], HasSubstr("memory.host_link_gbps has no effect: it applies only when memory.policy "
                                            "is swap, hybrid or auto"));
  EXPECT_THAT(error_in(kGood, {"--memory.compress=bf16", "--memory.policy=dtr", "--memory.budget=64MiB"}),
              HasSubstr("memory.compress = \"bf16\" shrinks what crosses the host link, and memory.policy = \"dtr\" "
                        "swaps nothing; set memory.policy = \"swap\" or \"hybrid\" (with memory.budget), or "
                        "memory.compress = \"lossless\""));
  EXPECT_THAT(error_in(kGood, {"--memory.compress=zip"}), HasSubstr("memory.compress"));
  EXPECT_THAT(error_in(kGood, {"--memory.optimizer_state=host", "--memory.policy=dtr", "--memory.budget=64MiB"}),
              HasSubstr("memory.optimizer_state = \"host\" moves the optimizer state over the host link, which "
                        "memory.policy = \"dtr\" does not open; set memory.policy = \"swap\" or \"hybrid\" (with "
                        "memory.budget), or memory.optimizer_state = \"device\""));
  EXPECT_THAT(error_in(kGood, {"--memory.optimizer_state=disk"}), HasSubstr("memory.optimizer_state"));
}

TEST_F(ConfigErrors, MemoryBudget) {
  EXPECT_THAT(error_in(kGood, {"--memory.budget=lots"}),
              HasSubstr("argument --memory.budget=lots: memory.budget = \"lots\" is not a memory size; use bytes "
                        "with a unit (\"1.5GiB\", \"800MiB\", \"2GB\") or a share of the device (\"60%\")"));
  for (const char* bad : {"150%", "-1GiB", "2 parsecs", "GiB"})
    EXPECT_THAT(error_in(kGood, {std::string("--memory.budget=") + bad}), HasSubstr("is not a memory size")) << bad;
  EXPECT_THAT(error_in(std::string(kGood) + "[memory]\nbudget = \"0\"\n"),
              HasSubstr("job.toml:7:10: memory.budget = \"0\" is not a memory size"));
  EXPECT_THAT(error_in(std::string(kGood) + "[memory]\npolicy = \"dtr\"\n"),
              HasSubstr("job.toml:7:10: memory.policy = \"dtr\" evicts to fit a budget, and memory.budget is not "
                        "set; set it too, e.g. memory.budget = \"2GiB\" or \"50%\""));
  EXPECT_THAT(error_in(kGood, {"--memory.policy=dtr_eq", "--memory.eviction_threshold=1.5"}),
              HasSubstr("memory.eviction_threshold: 1.5 is out of range"));
  auto bytes_of = [&](const std::string& budget) {
    return budget_bytes_of(load_config(dir_.write("b.toml", kGood), {override_of("--memory.budget=" + budget)}).config);
  };
  EXPECT_EQ(bytes_of("1.5GiB"), int64_t{3} << 29);
  EXPECT_EQ(bytes_of("800 MiB"), int64_t{800} << 20);
  EXPECT_EQ(bytes_of("2GB"), 2000000000);
  EXPECT_EQ(bytes_of("4096"), 4096);
  EXPECT_EQ(bytes_of("50%"), host_physical_memory_bytes() / 2);
  const LoadedConfig loaded = load_config(dir_.write("w.toml", kGood), {override_of("--memory.eviction_threshold=0.5")});
  ASSERT_EQ(loaded.warnings.size(), 1u);
  EXPECT_THAT(loaded.warnings[0], HasSubstr("memory.eviction_threshold has no effect: it applies only when "
                                            "memory.policy is not \"none\""));
}

TEST_F(ConfigErrors, CrossKeyRules) {
  EXPECT_THAT(error_in(kGood, {"--training.global_batch_size=64", "--training.micro_batch_size=24"}),
              HasSubstr("training.global_batch_size = 64 is not a multiple of training.micro_batch_size = 24; "
                        "use a divisor of the global batch (e.g. 32)"));
  EXPECT_THAT(error_in(kGood, {"--training.device=gpu"}),
              HasSubstr("training.device = \"gpu\" is not a device; use \"cpu\", \"cuda\" or \"cuda:N\""));
  if (!at::hasCUDA()) {
    EXPECT_THAT(error_in(kGood, {"--training.device=cuda"}), HasSubstr("has no CUDA or no GPU is visible"));
  }
  EXPECT_THAT(error_in(kGood, {"--training.min_lr=1.0"}), HasSubstr("training.min_lr = 1.0 exceeds training.lr"));
  EXPECT_THAT(error_in(kGood, {"--cluster.nodes=2", "--cluster.host_memory=lots"}),
              HasSubstr("cluster.host_memory = \"lots\" is not a memory size; use bytes with a unit, e.g. \"2TiB\""));
  EXPECT_THAT(error_in("[model]\nname = \"gpt\"\nn_head = 3\n[data]\ndataset = \"synthetic\"\n"),
              HasSubstr("job.toml:3:10: model.n_embd = 256 is not a multiple of model.n_head = 3"));
  EXPECT_THAT(error_in("[model]\nname = \"llama\"\nn_kv_heads = 3\n[data]\ndataset = \"synthetic\"\n"),
              HasSubstr("model.n_head = 8 is not a multiple of model.n_kv_heads = 3"));
  // A shape error points where its first key was set, the command line included (issue 64: the
  // n_kv_heads and block_size errors of a tensor-parallel run cited the n_head line).
  const std::string llama = "[model]\nname = \"llama\"\nn_head = 8\n[data]\ndataset = \"synthetic\"\n";
  EXPECT_THAT(error_in(llama, {"--model.n_kv_heads=1", "--parallel.tensor_parallel=2"}),
              HasSubstr("--model.n_kv_heads=1: model.n_kv_heads = 1 is not a multiple of parallel.tensor_parallel = 2"));
  EXPECT_THAT(error_in(llama + "[parallel]\ntensor_parallel = 2\n", {"--model.block_size=33", "--parallel.sequence_parallel=true"}),
              HasSubstr("--model.block_size=33: model.block_size = 33 is not a multiple of parallel.tensor_parallel = 2"));
  EXPECT_THAT(error_in(llama + "[parallel]\ntensor_parallel = 4\n", {"--model.n_kv_heads=2"}),
              HasSubstr("--model.n_kv_heads=2: model.n_kv_heads = 2 is not a multiple of parallel.tensor_parallel = 4"));
  EXPECT_THAT(error_in("[model]\nname = \"llama\"\nn_kv_heads = 2\n[data]\ndataset = \"synthetic\"\n[parallel]\n"
                       "tensor_parallel = 4\n"),
              HasSubstr("job.toml:3:14: model.n_kv_heads = 2 is not a multiple of parallel.tensor_parallel = 4"));
  EXPECT_THAT(error_in("[model]\nname = \"llama\"\n[data]\ndataset = \"synthetic\"\n", {"--parallel.tensor_parallel=3"}),
              HasSubstr("--parallel.tensor_parallel=3: model.n_head = 8 is not a multiple of parallel.tensor_parallel = 3"))
      << "n_head left at its default: the key that was set";
  EXPECT_THAT(error_in("[model]\nname = \"resnet\"\ndepth = 20\n[data]\ndataset = \"synthetic\"\n"),
              HasSubstr("model.depth = 20: use 18, 34 or 50"));
}

TEST_F(ConfigErrors, ModelAndDataMustFit) {
  EXPECT_THAT(error_in("[model]\nname = \"gpt\"\n[data]\ndataset = \"fashion_mnist\"\n"),
              HasSubstr("model.name = \"gpt\" trains on tokens"));
  EXPECT_THAT(error_in("[model]\nname = \"convnet\"\n[data]\ndataset = \"text\"\npath = \"x\"\n"),
              HasSubstr("only the decoders (model.name = \"gpt\" or \"llama\") take"));
  EXPECT_THAT(error_in("[model]\nname = \"gpt\"\n[data]\ndataset = \"text\"\n"),
              HasSubstr("data.path is required with data.dataset = \"text\""));
}

TEST_F(ConfigErrors, OverridesAreTypeCheckedAndWin) {
  EXPECT_THAT(error_in(kGood, {"--training.lr=fast"}),
              HasSubstr("argument --training.lr=fast: training.lr: expected a number, got 'fast'"));
  EXPECT_THAT(error_in(kGood, {"--trainng.lr=0.1"}),
              HasSubstr("argument --trainng.lr=0.1: unknown key trainng.lr; did you mean --training.lr?"));
  EXPECT_THAT(error_in(kGood, {"--lr=0.1"}), HasSubstr("overrides look like --section.key=value"));
  const std::string file = dir_.write("o.toml", std::string(kGood) + "[training]\nsteps = 7\n");
  const Config c = load_config(file, {override_of("--training.steps=20"), override_of("--model.name=gpt"),
                                      override_of("--model.hidden=[8, 4]")}).config;
  EXPECT_EQ(c.training.steps, 20);
  EXPECT_EQ(c.model.name, ModelKind::kGpt);  // a string may be typed without quotes
  EXPECT_EQ(c.model.hidden, (std::vector<int64_t>{8, 4}));
}

TEST_F(ConfigErrors, OptionsWithoutEffectWarn) {
  const std::string file = dir_.write("w.toml", std::string(kGood) + "[training]\nmomentum = 0.8\noptimizer = \"adamw\"\n");
  const LoadedConfig loaded = load_config(file, {override_of("--model.depth=50")});
  ASSERT_EQ(loaded.warnings.size(), 2u);
  EXPECT_THAT(loaded.warnings[0], HasSubstr("argument --model.depth=50: model.depth has no effect: it applies only "
                                            "when model.name = resnet"));
  EXPECT_THAT(loaded.warnings[1], HasSubstr("w.toml:7:12: training.momentum has no effect: it applies only when "
                                            "training.optimizer = sgd"));
  EXPECT_TRUE(load_config(dir_.write("g.toml", kGood), {}).warnings.empty());
}

}  // namespace
}  // namespace ht::test

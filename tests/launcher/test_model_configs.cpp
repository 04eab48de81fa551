// The shipped transformer configs at real sizes: each one's parameter count, from its shape
// alone, is the published count of the model it is named after; those too large for this
// machine are refused (exit 2, with the numbers) before anything large is allocated.
#include "launcher/config/config_loader.h"
#include "launcher/planning/model_size.h"
#include "alloc/byte_size.h"
#include "tests/support/run_binary.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>

namespace ht::test {
namespace {

using ::testing::HasSubstr;

int64_t parameters_of(const std::string& config_name) {
  const Config c = load_config(std::string(HT_SOURCE_DIR) + "/configs/" + config_name, {}).config;
  const std::optional<ModelStateSize> size = model_state_from_shape(c, c.model.vocab_size);
  return size ? size->parameters : -1;
}

TEST(ModelConfigs, ParameterCountsAreThePublishedOnes) {
  EXPECT_EQ(parameters_of("gpt2_124m.toml"), 124439808);      // Hugging Face's gpt2
  EXPECT_EQ(parameters_of("llama3_8b.toml"), 8030261248);     // Meta-Llama-3-8B
  EXPECT_EQ(parameters_of("llama3_70b.toml"), 70553706496);   // Meta-Llama-3-70B
  EXPECT_NEAR(static_cast<double>(parameters_of("gpt3_175b.toml")) / 175.0e9, 1.0, 0.005);  // "175.0B"
}

// A rank that shards the optimizer state holds its share of it: an 8B Llama with AdamW over 8
// ranks keeps 8 of its 16 bytes a parameter whole (parameters and gradients) and 8/8 of the rest.
TEST(ModelConfigs, ARanksStateIsItsShareWhereTheOptimizerIsSharded) {
  Config c = load_config(std::string(HT_SOURCE_DIR) + "/configs/llama3_8b.toml", {}).config;
  const ModelStateSize size = *model_state_from_shape(c, c.model.vocab_size);
  EXPECT_EQ(state_bytes_per_rank(c, size, 8), size.bytes) << "parallel.shard = none keeps it all";
  c.parallel.shard = ShardLevel::kOptimizer;
  EXPECT_EQ(state_bytes_per_rank(c, size, 1), size.bytes) << "one rank's share is the whole";
  EXPECT_EQ(state_bytes_per_rank(c, size, 8), size.parameters * 8 + size.parameters);
  EXPECT_EQ(state_bytes_per_rank(c, size, 3), size.parameters * 8 + (size.parameters * 8 + 2) / 3) << "rounded up";
  c.parallel.shard = ShardLevel::kGradients;  // the gradients' 4 bytes split too
  EXPECT_EQ(state_bytes_per_rank(c, size, 8), size.parameters * 4 + size.parameters * 12 / 8);
  c.parallel.shard = ShardLevel::kParameters;  // and the parameters' 4: all 16 over the ranks
  EXPECT_EQ(state_bytes_per_rank(c, size, 8), size.parameters * 16 / 8);
}

// training.optimizer_state_dtype = "bf16": AdamW's moments are 4 bytes a parameter, not 8.
TEST(ModelConfigs, Bf16MomentsAreHalfTheOptimizersState) {
  Config c = load_config(std::string(HT_SOURCE_DIR) + "/configs/llama3_8b.toml", {}).config;
  const ModelStateSize fp32 = *model_state_from_shape(c, c.model.vocab_size);
  c.training.optimizer_state_dtype = StateDtype::kBf16;
  const ModelStateSize bf16 = *model_state_from_shape(c, c.model.vocab_size);
  EXPECT_EQ(fp32.bytes, fp32.parameters * 16);
  EXPECT_EQ(bf16.bytes, bf16.parameters * 12);
  c.parallel.shard = ShardLevel::kOptimizer;
  EXPECT_EQ(state_bytes_per_rank(c, bf16, 8), bf16.parameters * 8 + bf16.parameters * 4 / 8);
}

// The host's available memory decides: an 8B model's 120 GiB of state fits the GPU machine's
// 128 GiB host (which then went on to look for its data), so there a budget below it stands in.
// The refusal says what one micro-batch adds, from a step traced on meta tensors.
TEST(ModelConfigs, ShapesTooLargeForThisMachineAreRefusedBeforeBuilding) {
  for (const char* name : {"llama3_8b.toml", "llama3_70b.toml", "gpt3_175b.toml"}) {
    const std::string path = std::string(HT_SOURCE_DIR) + "/configs/" + name;
    const Config c = load_config(path, {}).config;
    const bool fits_here = model_state_from_shape(c, c.model.vocab_size)->bytes <= host_available_memory_bytes();
    const std::string budget = fits_here ? " --memory.budget=16GiB" : "";
    if (fits_here) std::printf("%s: fits this host's available memory; refused under memory.budget = 16GiB\n", name);
    for (const std::string command : {"", "plan "}) {
      const ProcessResult r = run_binary(command + path + budget + " --job.output_dir=/tmp/ht-too-large-never-written");
      EXPECT_EQ(r.status, 2) << name << ": " << r.output;
      EXPECT_THAT(r.output, HasSubstr("parameters; with their gradients and adamw state")) << name;
      EXPECT_THAT(r.output, HasSubstr("stops before building it")) << name;
      EXPECT_THAT(r.output, HasSubstr("traced on meta tensors")) << name;  // what a micro-batch adds
    }
  }
  // A tensor-parallel rank holds its part: counted from the traced model, norms whole.
  const ProcessResult r = run_binary("plan " + std::string(HT_SOURCE_DIR) + "/configs/llama3_70b.toml "
                                     "--parallel.tensor_parallel=8 --parallel.sequence_parallel=true "
                                     "--job.output_dir=/tmp/ht-too-large-never-written");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("a rank with parallel.tensor_parallel = 8, its part 8.82B parameters"));
  EXPECT_NE(access("/tmp/ht-too-large-never-written", F_OK), 0) << "a refused run writes nothing";
}

}  // namespace
}  // namespace ht::test

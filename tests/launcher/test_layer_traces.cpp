// A deep decoder's steps stretched from three traced layers (launcher/planning/layer_traces.h,
// planner/repeated_layers.h) are what tracing every layer records: the same tensors, kernels
// (their gradient buckets too) and events, index for index, and so the same peaks, block times,
// pipeline cuts and buckets backward reads; with grouped heads, tied embeddings, bf16 and a
// tensor-parallel rank with sequence parallelism.
#include "launcher/data/dataset.h"
#include "launcher/planning/device_catalog.h"
#include "launcher/planning/trace_profile.h"
#include "planner/repeated_layers.h"
#include "tests/support/temp_dir.h"

#include <gmock/gmock.h>

#include <climits>

namespace ht::test {
namespace {

using ::testing::HasSubstr;

const char* kLlama = R"([model]
name = "llama"
n_layer = 7
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

const char* kTracedGpt = R"([model]
name = "gpt"
n_layer = 6
n_head = 4
n_embd = 64
block_size = 32
dropout = 0.1
[data]
dataset = "synthetic"
[training]
global_batch_size = 4
optimizer = "adamw"
)";

ModelProfile traced(const Config& c, const DataInfo& info, int64_t stretch_beyond) {
  TraceRequest request;
  request.precisions = {MixedPrecision::kOff, MixedPrecision::kBf16};
  request.micro_batches = {1, 2, 4};
  request.rates = device_rates(catalog_kind("h100-sxm", "", "test_layer_traces"));
  request.stretch_beyond_layers = stretch_beyond;
  return trace_profile(c, info, request);
}

void expect_same_profile(const std::string& toml, const std::vector<std::string>& args) {
  TempDir dir;
  const Config c = config_for(dir, toml, args);
  const DataSplits data = make_datasets(c);
  const ModelProfile whole = traced(c, data.info, INT_MAX);
  const ModelProfile stretched = traced(c, data.info, 4);
  EXPECT_THAT(stretched.how, HasSubstr("stretched from its first 3 of"));
  EXPECT_THAT(whole.how, ::testing::Not(HasSubstr("stretched")));
  EXPECT_EQ(stretched.optimizer_state_bytes, whole.optimizer_state_bytes);
  EXPECT_EQ(stretched.gradient_bytes, whole.gradient_bytes);
  EXPECT_EQ(stretched.block_buckets, whole.block_buckets);
  ASSERT_EQ(stretched.points.size(), whole.points.size());
  for (size_t i = 0; i < whole.points.size(); ++i) {
    const ProfilePoint &s = stretched.points[i], &w = whole.points[i];
    SCOPED_TRACE("micro-batch " + std::to_string(w.micro_batch) + (w.precision == MixedPrecision::kBf16 ? " bf16" : " fp32"));
    std::string difference;
    EXPECT_TRUE(same_step(s.trace, w.trace, &difference)) << difference;
    EXPECT_EQ(s.peak_bytes, w.peak_bytes);
    EXPECT_EQ(s.forward_backward_peak_bytes, w.forward_backward_peak_bytes);
    EXPECT_EQ(s.optimizer_peak_bytes, w.optimizer_peak_bytes);
    EXPECT_EQ(s.step_ms, w.step_ms);
    EXPECT_EQ(s.cut_bytes, w.cut_bytes);
    EXPECT_EQ(s.block_held_bytes, w.block_held_bytes);
    EXPECT_EQ(s.block_peak_bytes, w.block_peak_bytes);
    EXPECT_EQ(s.block_peak_backward_bytes, w.block_peak_backward_bytes);
    EXPECT_EQ(s.block_sent_unheld_bytes, w.block_sent_unheld_bytes);
    EXPECT_EQ(s.block_sent_held_bytes, w.block_sent_held_bytes);
    EXPECT_EQ(s.backward_read_buckets, w.backward_read_buckets);
    EXPECT_EQ(s.half_read_buckets, w.half_read_buckets);
    EXPECT_EQ(s.backward_copy_buckets, w.backward_copy_buckets);
    EXPECT_EQ(s.backward_fp32_buckets, w.backward_fp32_buckets);
    EXPECT_EQ(s.fp32_read_elements, w.fp32_read_elements);
    if (w.precision == MixedPrecision::kBf16) {  // the products' weights cast, the norms' gains read in fp32
      EXPECT_FALSE(w.half_read_buckets.empty());
      EXPECT_FALSE(w.backward_copy_buckets.empty());
      EXPECT_FALSE(w.fp32_read_elements.empty());
    }
    ASSERT_EQ(s.blocks.size(), w.blocks.size());
    for (size_t b = 0; b < w.blocks.size(); ++b) {
      EXPECT_EQ(s.blocks[b].forward_ms, w.blocks[b].forward_ms);
      EXPECT_EQ(s.blocks[b].backward_ms, w.blocks[b].backward_ms);
    }
  }
}

TEST(LayerTraces, LlamasStretchedStepsAreItsTracedSteps) { expect_same_profile(kLlama, {}); }

TEST(LayerTraces, ATensorParallelRanksStretchedStepsAreItsTracedSteps) {
  expect_same_profile(kLlama, {"--parallel.tensor_parallel=2", "--parallel.sequence_parallel=true"});
}

TEST(LayerTraces, TiedEmbeddingsAndDropoutStretch) { expect_same_profile(kTracedGpt, {}); }

TEST(LayerTraces, ShallowDecodersAreTracedWhole) {
  TempDir dir;
  const Config c = config_for(dir, kLlama, {"--model.n_layer=4"});
  const DataSplits data = make_datasets(c);
  EXPECT_THAT(traced(c, data.info, 0).how, ::testing::Not(HasSubstr("stretched")));
}

}  // namespace
}  // namespace ht::test

// A micro-batch traced on meta tensors (launcher/planning/meta_trace.h) is the step the engine
// runs on data, to the byte: the same kernels in the same order, the same tensors made by forward
// kernels, the same model bytes and the same peak; what the data run allocates beyond it is named
// (ATen's CPU kernels wrap scalars into 64-byte tensors, and layer norm's backward keeps partial
// sums per thread: a kernel's own workspace, which a meta kernel never allocates). At scale, the
// Llama 3 shapes trace in no memory, their parameters are the published counts, and a layer's
// saved activations are the planner's accounting (planner/tensor_terms.h) to the byte.
#include "launcher/model_factory.h"
#include "launcher/planning/meta_trace.h"
#include "launcher/user_error.h"
#include "planner/tensor_terms.h"
#include "tests/support/temp_dir.h"

#include <gmock/gmock.h>

#include <map>
#include <set>

namespace ht::test {
namespace {

const char* kSmall = R"([model]
name = "llama"
n_layer = 2
n_head = 4
n_kv_heads = 2
n_embd = 64
block_size = 32
[data]
dataset = "synthetic"
[training]
global_batch_size = 8
)";

DataInfo tokens(int64_t t, int64_t vocab) { return DataInfo{Task::kLanguageModel, {t}, vocab, "tokens", 0}; }

std::string kernel_name(const StepTrace& trace, int kernel) {
  if (kernel < 0) return "(between kernels)";
  const TraceKernel& k = trace.kernels[static_cast<size_t>(kernel)];
  return std::string(k.op) + (k.backward ? " backward" : "");
}

// Each tensor's bytes and the kernel that allocated it, in allocation order.
std::vector<std::pair<int64_t, std::string>> allocations(const StepTrace& trace) {
  std::vector<std::pair<int64_t, std::string>> out;
  int kernel = -1;
  for (const TraceEvent& e : trace.events) {
    if (e.kind == TraceEvent::Kind::kKernelBegins) kernel = e.index;
    if (e.kind == TraceEvent::Kind::kKernelEnds) kernel = -1;
    if (e.kind == TraceEvent::Kind::kAllocated) {
      out.emplace_back(trace.tensors[static_cast<size_t>(e.index)].bytes, kernel_name(trace, kernel));
    }
  }
  return out;
}

TEST(MetaTrace, AStepOnMetaTensorsIsTheStepOnDataToTheByte) {
  TempDir dir;
  for (const std::string family : {"llama", "gpt"}) {
    for (int64_t micro : {2, 4}) {
      SCOPED_TRACE(family + " at micro-batch " + std::to_string(micro));
      const Config c = config_for(dir, kSmall, {"--model.name=" + family});
      const TracedStep meta = trace_micro_batch(c, tokens(32, 96), micro, /*meta=*/true);
      const TracedStep data = trace_micro_batch(c, tokens(32, 96), micro, /*meta=*/false);
      EXPECT_EQ(meta.parameters, data.parameters);
      EXPECT_EQ(meta.model_bytes, data.model_bytes);
      EXPECT_EQ(meta.step_peak_bytes, data.step_peak_bytes);
      ASSERT_EQ(meta.trace.kernels.size(), data.trace.kernels.size());
      for (size_t k = 0; k < meta.trace.kernels.size(); ++k) {
        ASSERT_EQ(kernel_name(meta.trace, static_cast<int>(k)), kernel_name(data.trace, static_cast<int>(k))) << k;
      }
      // Every meta allocation is the data run's next one of the same kernel and size; the data
      // run's others are ATen's wrapped scalars and layer norm backward's partial sums.
      const auto mine = allocations(meta.trace), theirs = allocations(data.trace);
      size_t at = 0;
      std::set<std::string> extra;
      for (const auto& [bytes, kernel] : theirs) {
        if (at < mine.size() && mine[at] == std::make_pair(bytes, kernel)) {
          ++at;
        } else {
          EXPECT_TRUE(bytes == CpuArena::kAlignment || kernel == "layer_norm backward") << bytes << " in " << kernel;
          extra.insert(kernel);
        }
      }
      EXPECT_EQ(at, mine.size()) << "a meta allocation the data run did not make: " << mine[std::min(at, mine.size() - 1)].second;
    }
  }
}

// Llama 3 8B and 70B at their full sequence length (8192), one sample: built and traced on meta
// in no memory. Their parameter counts are Meta's (8.03B, 70.6B), their fp32 parameters are
// 4 bytes each, and a middle layer's saved activations are the planner's accounting exactly.
TEST(MetaTrace, LlamaThreeShapesTraceInNoMemoryAndMatchTheAccounting) {
  for (const auto& [file, parameters] : std::vector<std::pair<std::string, int64_t>>{
           {"configs/llama3_8b.toml", 8030261248}, {"configs/llama3_70b.toml", 70553706496}}) {
    SCOPED_TRACE(file);
    const Config c = load_config(std::string(HT_SOURCE_DIR) + "/" + file, {}).config;
    const TracedStep step = trace_micro_batch(c, tokens(c.model.block_size, 128256), 1, true, int64_t{1} << 42);
    EXPECT_EQ(step.parameters, parameters);
    EXPECT_EQ(step.model_bytes, 4 * parameters);
    // Layer 1's saved tensors: made by its forward kernels, alive when backward begins.
    std::vector<char> alive(step.trace.tensors.size(), 0);
    int kernel = -1;
    int64_t saved = 0;
    for (const TraceEvent& e : step.trace.events) {
      if (e.kind == TraceEvent::Kind::kKernelBegins) {
        kernel = e.index;
        if (step.trace.kernels[static_cast<size_t>(kernel)].backward) break;
      }
      if (e.kind == TraceEvent::Kind::kAllocated && kernel >= 0 && step.trace.kernels[static_cast<size_t>(kernel)].block == 2) {
        alive[static_cast<size_t>(e.index)] = 1;
      }
      if (e.kind == TraceEvent::Kind::kFreed) alive[static_cast<size_t>(e.index)] = 0;
    }
    for (size_t t = 0; t < alive.size(); ++t)
      if (alive[t]) saved += step.trace.tensors[t].bytes;
    const TensorShape shape = tensor_shape(decoder_options(c.model, 128256));
    EXPECT_EQ(saved, layer_activation_bytes(shape, 1, 1, false));
  }
}

// What is not traced yet says so, naming the key.
TEST(MetaTrace, ModelsWithoutShapeRulesAreRefusedNamingTheKey) {
  TempDir dir;
  const Config c = config_for(dir, kSmall, {"--model.name=gpt", "--parallel.tensor_parallel=2"});
  try {
    trace_micro_batch(c, tokens(32, 96), 2);
    FAIL() << "traced";
  } catch (const UserError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("parallel.tensor_parallel > 1 is not traced yet"));
  }
}

}  // namespace
}  // namespace ht::test

// A micro-batch traced on meta tensors (launcher/planning/meta_trace.h) is the step the engine
// runs on data, to the byte: the same kernels in the same order, the same tensors made by forward
// kernels, the same model bytes and the same peak; what the data run allocates beyond it is named
// (ATen's CPU kernels wrap scalars into 64-byte tensors, and layer norm's backward keeps partial
// sums per thread: a kernel's own workspace, which a meta kernel never allocates); the optimizer's
// first step makes the same state with the same temporaries. At scale, the
// Llama 3 shapes trace in no memory, their parameters are the published counts, and a layer's
// saved activations are the planner's accounting (planner/tensor_terms.h) to the byte.
#include "alloc/cpu_arena.h"
#include "launcher/model_factory.h"
#include "launcher/planning/meta_trace.h"
#include "planner/tensor_terms.h"
#include "runtime/kernel_workspace.h"
#include "runtime/thread_pools.h"
#include "runtime/traced_device.h"
#include "tests/support/cpu_features.h"
#include "tests/support/temp_dir.h"

#include <ATen/Parallel.h>
#include <gmock/gmock.h>

#include <map>
#include <set>
#include <sstream>

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
optimizer = "adamw"
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

// Every meta allocation is the data run's next one of the same kernel and size; the data run's
// others are ATen's wrapped scalars (64-byte blocks) and the `workspaces` kernels' own temporaries
// (a meta kernel allocates only outputs).
void expect_meta_allocations_in_the_data_run(const StepTrace& meta, const StepTrace& data,
                                             const std::set<std::string>& workspaces) {
  const auto mine = allocations(meta), theirs = allocations(data);
  size_t at = 0;
  for (const auto& [bytes, kernel] : theirs) {
    if (at < mine.size() && mine[at] == std::make_pair(bytes, kernel)) {
      ++at;
    } else {
      EXPECT_TRUE(bytes == CpuArena::kAlignment || workspaces.count(kernel) > 0) << bytes << " in " << kernel;
    }
  }
  EXPECT_EQ(at, mine.size()) << "a meta allocation the data run did not make: " << mine[std::min(at, mine.size() - 1)].second;
}

// The step on meta against the step on data, allocation by allocation.
// `scalars`: ATen's wrapped scalars (64-byte blocks, data only) that may be alive at the peak.
void expect_the_step_on_data(const Config& c, int64_t micro,
                             const std::set<std::string>& workspaces = {"layer_norm backward"}, int64_t scalars = 0) {
  const TracedStep meta = trace_micro_batch(c, tokens(32, 96), micro, /*meta=*/true);
  const TracedStep data = trace_micro_batch(c, tokens(32, 96), micro, /*meta=*/false);
  EXPECT_EQ(meta.parameters, data.parameters);
  EXPECT_EQ(meta.model_bytes, data.model_bytes);
  EXPECT_GE(data.step_peak_bytes, meta.step_peak_bytes);
  EXPECT_LE(data.step_peak_bytes - meta.step_peak_bytes, scalars * CpuArena::kAlignment);
  EXPECT_EQ(meta.optimizer_state_bytes, data.optimizer_state_bytes);
  // The optimizer's temporaries, but two of ATen's wrapped scalars (64-byte blocks) on data.
  EXPECT_GE(data.optimizer_peak_bytes, meta.optimizer_peak_bytes);
  EXPECT_LE(data.optimizer_peak_bytes - meta.optimizer_peak_bytes, 2 * CpuArena::kAlignment);
  ASSERT_EQ(meta.trace.kernels.size(), data.trace.kernels.size());
  for (size_t k = 0; k < meta.trace.kernels.size(); ++k) {
    ASSERT_EQ(kernel_name(meta.trace, static_cast<int>(k)), kernel_name(data.trace, static_cast<int>(k))) << k;
  }
  expect_meta_allocations_in_the_data_run(meta.trace, data.trace, workspaces);
}

// Bytes that model block `block`'s forward kernels allocated and that are still alive when the
// first backward kernel begins: what the block saves for backward (under 16-bit autocast, its
// weights' 16-bit copies left out: casts that read no activation).
int64_t saved_by_block(const StepTrace& trace, int block) {
  std::vector<char> alive(trace.tensors.size(), 0);
  int kernel = -1;
  for (const TraceEvent& e : trace.events) {
    if (e.kind == TraceEvent::Kind::kKernelBegins) {
      kernel = e.index;
      if (trace.kernels[static_cast<size_t>(kernel)].backward) break;
    }
    if (e.kind == TraceEvent::Kind::kAllocated && kernel >= 0 && trace.kernels[static_cast<size_t>(kernel)].block == block) {
      const TraceKernel& k = trace.kernels[static_cast<size_t>(kernel)];
      alive[static_cast<size_t>(e.index)] = !(std::string(k.op) == "cast" && k.inputs.empty());
    }
    if (e.kind == TraceEvent::Kind::kFreed) alive[static_cast<size_t>(e.index)] = 0;
  }
  int64_t saved = 0;
  for (size_t t = 0; t < alive.size(); ++t)
    if (alive[t]) saved += trace.tensors[t].bytes;
  return saved;
}

TEST(MetaTrace, AStepOnMetaTensorsIsTheStepOnDataToTheByte) {
  TempDir dir;
  for (const std::string family : {"llama", "gpt"}) {
    for (int64_t micro : {2, 4}) {
      SCOPED_TRACE(family + " at micro-batch " + std::to_string(micro));
      expect_the_step_on_data(config_for(dir, kSmall, {"--model.name=" + family}), micro);
    }
  }
}

// A tensor-parallel rank's part (its group mirrored, as the profiler mirrors it), with and without
// sequence parallelism: the same, to the byte. A bf16 step under autocast: the same peak and
// allocations; this CPU's bf16 contractions also convert their operands in buffers of their own.
TEST(MetaTrace, ATensorParallelRankAndABf16StepAreTheStepOnData) {
  TempDir dir;
  for (const std::string& options : {std::string("--parallel.tensor_parallel=2"),
                                     std::string("--parallel.tensor_parallel=2 --parallel.sequence_parallel=true")}) {
    SCOPED_TRACE(options);
    std::vector<std::string> args;
    std::istringstream words(options);
    for (std::string w; words >> w;) args.push_back(w);
    expect_the_step_on_data(config_for(dir, kSmall, args), 4);
  }
  // RMS norm and layer norm on 16-bit inputs. GPT-2's data run in bf16 peaks 128 bytes above its
  // trace: two of ATen's wrapped scalars (its attention and loss kernels make them on data, a meta
  // kernel never) alive at the peak.
  for (const std::string family : {"llama", "gpt"}) {
    SCOPED_TRACE(family + " in bf16");
    expect_the_step_on_data(config_for(dir, kSmall, {"--training.mixed_precision=bf16", "--model.name=" + family}), 4,
                            {"layer_norm backward", "linear", "linear backward", "attention", "attention backward"},
                            family == "gpt" ? 2 : 0);
  }
}

// The largest tensor a forward kernel of `op` allocates in the trace.
int64_t largest_allocation(const StepTrace& trace, const std::string& op) {
  int64_t largest = 0;
  int kernel = -1;
  for (const TraceEvent& e : trace.events) {
    if (e.kind == TraceEvent::Kind::kKernelBegins) kernel = e.index;
    if (e.kind != TraceEvent::Kind::kAllocated || kernel < 0) continue;
    const TraceKernel& k = trace.kernels[static_cast<size_t>(kernel)];
    if (!k.backward && std::string(k.op) == op) largest = std::max(largest, trace.tensors[static_cast<size_t>(e.index)].bytes);
  }
  return largest;
}

// A bf16 step traced for a GPU (runtime/traced_device.h) runs layer norm as the GPU does: its bf16
// input into the kernel with bf16 copies of the weights, no fp32 copy of it; traced for this CPU,
// the input is widened to fp32 first (twice its bytes). The saved activations are the same.
TEST(MetaTrace, AStepTracedForAGpuRunsLayerNormInBf16) {
  TempDir dir;
  const Config c = config_for(dir, kSmall, {"--model.name=gpt", "--training.mixed_precision=bf16"});
  const TracedStep cpu = trace_micro_batch(c, tokens(32, 96), 4);
  TracedStep gpu;
  {
    const TracedForGpu traced_for(true);
    gpu = trace_micro_batch(c, tokens(32, 96), 4);
  }
  const int64_t x_bytes = int64_t{4} * c.model.block_size * c.model.n_embd * 2;  // (4, T, n_embd) in bf16
  EXPECT_EQ(largest_allocation(cpu.trace, "layer_norm"), 2 * x_bytes);
  EXPECT_EQ(largest_allocation(gpu.trace, "layer_norm"), x_bytes);
  EXPECT_EQ(saved_by_block(gpu.trace, 2), saved_by_block(cpu.trace, 2));
  EXPECT_LE(gpu.step_peak_bytes, cpu.step_peak_bytes);
  EXPECT_FALSE(TracedForGpu::current());
}

// A layer's saved activations on a rank of t = 1, 2, 4, with and without sequence parallelism,
// in fp32 and in bf16 (every activation 16-bit, the statistics fp32): the planner's accounting,
// which bench_tensor_parallel and bench_activation_bytes hold against measured runs.
TEST(MetaTrace, ALayersSavedActivationsAreThePlannersAccounting) {
  TempDir dir;
  for (const std::string family : {"llama", "gpt"}) {
    for (const std::string precision : {"off", "bf16"}) {
      for (int t : {1, 2, 4}) {
        for (bool sp : {false, true}) {
          if (t == 1 && sp) continue;
          SCOPED_TRACE(family + " " + precision + " t = " + std::to_string(t) + (sp ? " with SP" : ""));
          const Config c = config_for(dir, kSmall, {"--model.name=" + family, "--model.n_kv_heads=4",
                                                    "--training.mixed_precision=" + precision,
                                                    "--parallel.tensor_parallel=" + std::to_string(t),
                                                    std::string("--parallel.sequence_parallel=") + (sp ? "true" : "false")});
          const TracedStep step = trace_micro_batch(c, tokens(32, 96), 4);
          EXPECT_EQ(saved_by_block(step.trace, 2), layer_activation_bytes(tensor_shape(decoder_options(c.model, 96)), 4, t,
                                                                          sp, nullptr, precision == "off" ? 4 : 2));
        }
      }
    }
  }
}

// Llama 3 8B and 70B at their full sequence length (8192), one sample: built and traced on meta
// in no memory. Their parameter counts are Meta's (8.03B, 70.6B), their fp32 parameters are
// 4 bytes each, and a middle layer's saved activations are the planner's accounting exactly; so
// are 70B's on a rank of t = 8 with sequence parallelism (Megatron's layout for it).
TEST(MetaTrace, LlamaThreeShapesTraceInNoMemoryAndMatchTheAccounting) {
  struct Case {
    std::string file;
    int t;
    int64_t parameters;  // of the whole model
  };
  for (const Case& c : std::vector<Case>{{"configs/llama3_8b.toml", 1, 8030261248},
                                         {"configs/llama3_70b.toml", 1, 70553706496},
                                         {"configs/llama3_70b.toml", 8, 70553706496}}) {
    SCOPED_TRACE(c.file + " at t = " + std::to_string(c.t));
    std::vector<ConfigOverride> overrides{override_of("--training.mixed_precision=off")};  // the accounting's fp32
    if (c.t > 1) {
      overrides.push_back(override_of("--parallel.tensor_parallel=" + std::to_string(c.t)));
      overrides.push_back(override_of("--parallel.sequence_parallel=true"));
    }
    const Config config = load_config(std::string(HT_SOURCE_DIR) + "/" + c.file, overrides).config;
    const TracedStep step = trace_micro_batch(config, tokens(config.model.block_size, 128256), 1, true, int64_t{1} << 42);
    const DecoderOptions o = decoder_options(config.model, 128256);
    EXPECT_EQ(step.optimizer_state_bytes, 2 * step.model_bytes) << "AdamW's two moments";
    if (c.t == 1) {
      EXPECT_EQ(step.parameters, c.parameters);
      EXPECT_EQ(step.model_bytes, 4 * c.parameters);
    } else {  // every split tensor's 1/t and the replicated norms whole (the vocabulary divides by 8)
      const int64_t norms = (2 * o.n_layer + 1) * o.n_embd;
      EXPECT_EQ(step.parameters, (c.parameters - norms) / c.t + norms);
    }
    EXPECT_EQ(saved_by_block(step.trace, 2), layer_activation_bytes(tensor_shape(o), 1, c.t, c.t > 1));
  }
}

// Models with convolutions, batch norm and pooling trace too. Every meta allocation is the data
// run's, and the data run's others are its kernels' own workspaces (the convolutions' oneDNN
// reorders or im2col columns and ATen's channels-last copy of a 3-channel input, batch norm's
// statistics, max pooling's conversions to its gradient's layout), which no meta kernel
// allocates: declared per op (runtime/kernel_workspace.h) inside a DeclaredWorkspaces scope, the
// traced peak is the data run's to the byte, in both layouts, at micro-batch 1 (im2col) and 4
// (oneDNN), on one thread and two. Without them ResNet's is 1.3% and the supernet's 51% lower
// at micro-batch 1 (NCHW).
TEST(MetaTrace, ConvolutionModelsTraceWithTheirKernelsWorkspaces) {
  TempDir dir;
  const char* images = R"([model]
name = "convnet"
channels = [8, 16]
fc_hidden = 32
[data]
dataset = "synthetic"
[training]
global_batch_size = 8
)";
  const std::set<std::string> workspaces{"conv2d", "conv2d backward", "batch_norm", "batch_norm backward",
                                         "max_pool2d backward", "adaptive_avg_pool2d", "adaptive_avg_pool2d backward"};
  // The convolution rules are oneDNN's AVX-512 kernels'; elsewhere the trace is only a lower bound.
  const bool avx512 = cpu_has_avx512_core();
  if (!avx512) std::printf("[ exact peaks skipped ] %s\n", kWithoutAvx512);
  const int threads = at::get_num_threads();
  for (const int t : {1, 2}) {
    set_compute_threads(t);
    for (const bool channels_last : {false, true}) {
      const int64_t c = channels_last ? 3 : 1;  // RGB: ATen copies the input to channels-last
      const DataInfo info{Task::kClassification, {c, 16, 16}, 10, "images", 0};
      for (const std::string name : {"mlp", "convnet", "resnet", "supernet"}) {
        for (const int64_t micro : {1, 4}) {
          SCOPED_TRACE(name + " at micro-batch " + std::to_string(micro) + (channels_last ? ", channels-last" : "") +
                       ", threads " + std::to_string(t));
          const Config config = config_for(dir, images, {"--model.name=" + name, "--data.synthetic_shape=[" + std::to_string(c) + ",16,16]",
                                                          std::string("--training.channels_last=") + (channels_last ? "true" : "false")});
          const TracedStep bare = trace_micro_batch(config, info, micro, true);
          const TracedStep data = trace_micro_batch(config, info, micro, false);
          EXPECT_EQ(bare.model_bytes, data.model_bytes);
          EXPECT_EQ(bare.optimizer_state_bytes, data.optimizer_state_bytes);
          expect_meta_allocations_in_the_data_run(bare.trace, data.trace, workspaces);
          EXPECT_LE(bare.step_peak_bytes, data.step_peak_bytes) << "workspaces only add";
          const DeclaredWorkspaces declared(WorkspaceRules::kThisCpu);
          const int64_t traced = trace_micro_batch(config, info, micro, true).step_peak_bytes;
          if (avx512) {
            EXPECT_EQ(traced, data.step_peak_bytes);
          } else {
            EXPECT_LE(traced, data.step_peak_bytes) << "declared workspaces are ones the run holds";
          }
        }
      }
    }
  }
  set_compute_threads(threads);
}

// The rules themselves, on the shapes measured: oneDNN's reorders (forward: input and weight, or
// the blocked output; backward: input and the output's gradient, or the weight's blocked
// gradient), THNN's im2col columns for one small image, batch norm's statistics, layer norm's
// per-thread sums; nothing outside a scope that names them.
TEST(MetaTrace, WorkspaceRulesOfThisCpu) {
  const std::vector<int64_t> x{4, 64, 16, 16}, w{64, 64, 3, 3}, y{4, 64, 16, 16}, one{1, 1};
  WorkspaceQuery q;
  q.input = x;
  q.weight = w;
  q.output = y;
  q.stride = one;
  q.padding = one;
  const int64_t input = 4 * 64 * 16 * 16 * 4, weight = 64 * 64 * 9 * 4;
  EXPECT_EQ(workspace_blocks(Workspace::kConvolution, q, WorkspaceRules::kThisCpu), (std::vector<int64_t>{input, weight}));
  EXPECT_TRUE(workspace_blocks(Workspace::kConvolution, q, WorkspaceRules::kNone).empty());
  q.backward = true;
  EXPECT_EQ(workspace_blocks(Workspace::kConvolution, q, WorkspaceRules::kThisCpu), (std::vector<int64_t>{input, input}));
  const std::vector<int64_t> x1{1, 64, 16, 16}, y1{1, 64, 16, 16};
  q.input = x1;
  q.output = y1;
  q.backward = false;
  EXPECT_EQ(workspace_blocks(Workspace::kConvolution, q, WorkspaceRules::kThisCpu),
            (std::vector<int64_t>{64 * 9 * 16 * 16 * 4})) << "one image: im2col";
  // Channels-last, one thread: the scratchpad and the weight in blocks of 16 output channels
  // (8 padded to 16); backward, the weight in blocks of 16 of both for the input's gradient.
  const std::vector<int64_t> x8{4, 8, 16, 16}, w8{8, 8, 3, 3}, y8{4, 8, 16, 16};
  q.input = x8;
  q.weight = w8;
  q.output = y8;
  q.channels_last = true;
  const int64_t w8_bytes = 8 * 8 * 9 * 4;
  EXPECT_EQ(workspace_blocks(Workspace::kConvolution, q, WorkspaceRules::kThisCpu),
            (std::vector<int64_t>{2 * 4096, 2 * w8_bytes}));
  q.input_copied = true;  // ATen copies an NCHW input first
  EXPECT_EQ(workspace_blocks(Workspace::kConvolution, q, WorkspaceRules::kThisCpu),
            (std::vector<int64_t>{4 * 8 * 16 * 16 * 4, 2 * 4096, 2 * w8_bytes}));
  q.input_copied = false;
  q.backward = true;
  EXPECT_EQ(workspace_blocks(Workspace::kConvolution, q, WorkspaceRules::kThisCpu),
            (std::vector<int64_t>{2 * w8_bytes, w8_bytes})) << "the weight's gradient blocked, and plain";
  q.weight_grad = false;
  EXPECT_EQ(workspace_blocks(Workspace::kConvolution, q, WorkspaceRules::kThisCpu), (std::vector<int64_t>{4 * w8_bytes}));
  q.weight_grad = true;
  q.input_grad = false;
  EXPECT_EQ(workspace_blocks(Workspace::kConvolution, q, WorkspaceRules::kThisCpu),
            (std::vector<int64_t>{2 * w8_bytes, w8_bytes}));
  EXPECT_EQ(workspace_blocks(Workspace::kBatchNorm, q, WorkspaceRules::kThisCpu), (std::vector<int64_t>{2 * 8 * 4}));
  const std::vector<int64_t> pooled{4, 8, 8, 8};
  q.output = pooled;
  EXPECT_TRUE(workspace_blocks(Workspace::kMaxPool, q, WorkspaceRules::kThisCpu).empty()) << "the same layouts";
  q.input_copied = true;
  EXPECT_EQ(workspace_blocks(Workspace::kMaxPool, q, WorkspaceRules::kThisCpu),
            (std::vector<int64_t>{4 * 8 * 8 * 8 * 8, 4 * 8 * 16 * 16 * 4})) << "int64 indices and the gradient";
  q.normalized = 64;
  q.backward = true;
  q.threads = 2;
  EXPECT_EQ(workspace_blocks(Workspace::kLayerNorm, q, WorkspaceRules::kThisCpu), (std::vector<int64_t>{2 * 2 * 64 * 4}));
  q.backward = false;
  EXPECT_EQ(workspace_blocks(Workspace::kBatchNorm, q, WorkspaceRules::kThisCpu), (std::vector<int64_t>{8 * 4, 8 * 4}));
  EXPECT_EQ(DeclaredWorkspaces::current(), WorkspaceRules::kNone);
  {
    const DeclaredWorkspaces declared(WorkspaceRules::kThisCpu);
    EXPECT_EQ(DeclaredWorkspaces::current(), WorkspaceRules::kThisCpu);
  }
  EXPECT_EQ(DeclaredWorkspaces::current(), WorkspaceRules::kNone);
}

}  // namespace
}  // namespace ht::test

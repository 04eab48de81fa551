// What one decoder layer saves for backward, in bytes per s·b·h (sequence x micro-batch x
// hidden), traced (launcher/planning/meta_trace.h: the engine's own step on meta tensors, which
// tests/launcher/test_meta_trace.cpp pins to the step on data to the byte), against this project's
// tensor-by-tensor accounting (planner/tensor_terms.h, layer_activation_bytes; docs/memory.md lists
// the tensors) and Korthikanti et al.'s count for 16 bits. Under bf16 the layer's weights' 16-bit
// copies (autocast's, one per forward today) are reported beside the activations, not in them.
//
//   bench_activation_bytes [--quick] [--data]
//
// --data also runs the small rows' step on data and checks that it saves what the trace says.
// Exits 1 when a layer's traced bytes are more than 5% from the accounting, when the small Llama
// layer saves more than 36 bytes per s·b·h in bf16 (issue 65; 50.3 before it), or when a GPT-2
// layer without dropout is more than 5% from 32 (Korthikanti et al.'s 34 less the dropout masks).
#include "launcher/config/config_loader.h"
#include "launcher/model_factory.h"
#include "launcher/planning/meta_trace.h"
#include "models/decoder_options.h"
#include "planner/tensor_terms.h"

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace ht {
namespace {

struct Case {
  const char* name;
  const char* config;  // relative to the source tree
  std::vector<std::string> overrides;
  int64_t micro_batch;
  bool small;  // quick to run on data too
};

const std::vector<Case> kCases{
    {"Llama small, s 512", "configs/llama_small.toml", {"--model.block_size=512"}, 2, true},
    {"GPT-2 h 256, s 512", "configs/gpt2_124m.toml", {"--model.n_embd=256", "--model.n_head=8", "--model.block_size=512"}, 2, true},
    {"GPT-2 124M", "configs/gpt2_124m.toml", {}, 2, false},
    {"Llama 3 8B", "configs/llama3_8b.toml", {}, 1, false},
};

struct Saved {
  int64_t activations = 0;   // bytes block `block`'s forward kernels made and backward will read
  int64_t weight_copies = 0; // of those, the 16-bit copies of weights (casts that read no activation)
};

// Tensors that block `block`'s forward kernels allocated and that are alive when the first
// backward kernel begins.
Saved saved_by_block(const StepTrace& trace, int block) {
  std::vector<char> alive(trace.tensors.size(), 0), weight_copy(trace.tensors.size(), 0);
  int kernel = -1;
  for (const TraceEvent& e : trace.events) {
    if (e.kind == TraceEvent::Kind::kKernelBegins) {
      kernel = e.index;
      if (trace.kernels[static_cast<size_t>(kernel)].backward) break;
    }
    if (e.kind == TraceEvent::Kind::kAllocated && kernel >= 0) {
      const TraceKernel& k = trace.kernels[static_cast<size_t>(kernel)];
      if (k.block != block) continue;
      alive[static_cast<size_t>(e.index)] = 1;
      weight_copy[static_cast<size_t>(e.index)] = std::strcmp(k.op, "cast") == 0 && k.inputs.empty();
    }
    if (e.kind == TraceEvent::Kind::kFreed) alive[static_cast<size_t>(e.index)] = 0;
  }
  Saved s;
  for (size_t t = 0; t < alive.size(); ++t) {
    if (!alive[t]) continue;
    (weight_copy[t] ? s.weight_copies : s.activations) += trace.tensors[t].bytes;
  }
  return s;
}

struct Row {
  std::string name, precision;
  double traced = 0, accounted = 0, weights = 0;  // bytes per s·b·h
  bool data_checked = false, data_equal = true;
  bool llama = true;
};

Row measure(const Case& c, const std::string& precision, bool data) {
  std::vector<ConfigOverride> overrides{override_of("--model.n_layer=2"), override_of("--data.dataset=synthetic"),
                                        override_of("--training.mixed_precision=" + precision)};
  for (const std::string& o : c.overrides) overrides.push_back(override_of(o));
  const Config config = load_config(std::string(HT_SOURCE_DIR) + "/" + c.config, overrides).config;
  const int64_t vocab = config.model.vocab_size > 0 ? config.model.vocab_size : 4096;
  const DataInfo info{Task::kLanguageModel, {config.model.block_size}, vocab, "tokens", 0};
  const DecoderOptions o = decoder_options(config.model, vocab);
  const double sbh = static_cast<double>(c.micro_batch * o.block_size * o.n_embd);
  const int block = 2;  // embed, h0, h1, head: the second layer
  const TracedStep step = trace_micro_batch(config, info, c.micro_batch, true, int64_t{1} << 42);
  const Saved traced = saved_by_block(step.trace, block);
  Row r;
  r.name = c.name;
  r.precision = precision;
  r.llama = o.is_llama();
  r.traced = static_cast<double>(traced.activations) / sbh;
  r.weights = static_cast<double>(traced.weight_copies) / sbh;
  const int64_t element = precision == "off" ? 4 : 2;
  r.accounted = static_cast<double>(layer_activation_bytes(tensor_shape(o), c.micro_batch, 1, false, nullptr, element)) / sbh;
  if (data && c.small) {
    const TracedStep run = trace_micro_batch(config, info, c.micro_batch, false);
    const Saved on_data = saved_by_block(run.trace, block);
    r.data_checked = true;
    r.data_equal = on_data.activations == traced.activations && on_data.weight_copies == traced.weight_copies;
  }
  return r;
}

}  // namespace
}  // namespace ht

int main(int argc, char** argv) {
  using namespace ht;
  CLI::App app{"A decoder layer's saved activations per s·b·h, traced against the accounting"};
  bool quick = false, data = false;
  app.add_flag("--quick", quick, "the small rows only");
  app.add_flag("--data", data, "also run the small rows' step on data and compare");
  CLI11_PARSE(app, argc, argv);

  std::vector<Row> rows;
  for (const Case& c : kCases) {
    if (quick && !c.small) continue;
    for (const char* precision : {"off", "bf16"}) {
      rows.push_back(measure(c, precision, data));
      std::fflush(stdout);
    }
  }
  std::printf("A decoder layer's saved activations, bytes per s*b*h (one rank, no dropout)\n\n");
  std::printf("%-20s %-6s %9s %10s %7s %16s %s\n", "model", "type", "traced", "accounted", "diff", "weight copies",
              "on data");
  bool ok = true;
  for (const Row& r : rows) {
    const double diff = r.traced / r.accounted - 1;
    const bool near = std::abs(diff) <= 0.05;
    ok &= near && r.data_equal;
    std::printf("%-20s %-6s %9.2f %10.2f %+6.1f%% %16.2f %s\n", r.name.c_str(), r.precision == "off" ? "fp32" : "bf16",
                r.traced, r.accounted, 100 * diff, r.weights,
                !r.data_checked ? "-" : r.data_equal ? "the same bytes" : "DIFFERENT");
    if (r.precision != "bf16") continue;
    if (r.llama && r.name.rfind("Llama small", 0) == 0 && r.traced > 36) {
      std::printf("  over the 36 bytes per s*b*h a 16-bit Llama layer is held to\n");
      ok = false;
    }
    if (!r.llama && std::abs(r.traced / 32 - 1) > 0.05) {
      std::printf("  more than 5%% from Korthikanti et al.'s 32 (34 less the two dropout masks)\n");
      ok = false;
    }
  }
  std::printf("\n(accounted: planner/tensor_terms.h, layer_activation_bytes, which docs/memory.md lists tensor by tensor; "
              "weight copies: autocast's 16-bit copies of the layer's weights, made each forward, not counted above)\n");
  if (!ok) std::printf("FAILED: see the rows above\n");
  return ok ? 0 : 1;
}

#pragma once
// A deep decoder's micro-batch traced through three of its layers and stretched to all of them
// (planner/repeated_layers.h): Llama 3 70B's step from a trace of 3 layers, not 80. Each time it
// is asked, it traces the three-layer model and the four-layer one, and uses the stretch only if
// three layers stretched to four are the four-layer model's step, tensor for tensor, kernel for
// kernel and event for event, its peak the arena's, and its backward's buckets the same; else it
// says why and the caller traces the deep model whole. The stretched step is what tracing the
// deep model records: held to it at six and seven layers (tests/launcher/test_layer_traces.cpp).

#include "launcher/config/config.h"
#include "launcher/data/dataset.h"
#include "launcher/planning/meta_trace.h"
#include "planner/repeated_layers.h"

#include <memory>
#include <string>
#include <unordered_map>

namespace ht {

class GradientBuffer;

class LayerTraces {
 public:
  static constexpr int64_t kTraced = 3;  // the layers traced: the copied one has one on each side

  // Null unless `config` is a decoder of more than `beyond` layers. Builds the shallow models in
  // the live meta arena (launcher/planning/meta_trace.h); `deep` and `deep_buckets` (its
  // parameters' buckets, record_block_buckets) are the model it stands in for.
  static std::unique_ptr<LayerTraces> make(const Config& config, const DataInfo& info, const Model& deep,
                                           const std::unordered_map<const c10::TensorImpl*, size_t>& deep_buckets,
                                           int64_t beyond);
  ~LayerTraces();

  // One micro-batch of the deep model under `config`'s precision: out.trace, out.step_peak_bytes
  // and extras.backward_read_buckets (no static plans' graph), or false and why().
  bool trace(const Config& config, const std::shared_ptr<CpuArena>& arena, const DataInfo& info, int64_t micro,
             TracedStep& out, TraceExtras& extras);
  const std::string& why() const { return why_; }
  int64_t layers() const { return layers_; }

 private:
  struct Shallow;
  LayerTraces() = default;

  std::unique_ptr<Shallow> three_, four_;
  LayerRepeat to_four_, to_deep_;
  int64_t layers_ = 0;
  int64_t shallow_bytes_ = 0;  // the shallow models' parameters and gradients in the arena
  std::string why_;
};

}  // namespace ht

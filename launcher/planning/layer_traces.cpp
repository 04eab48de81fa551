#include "launcher/planning/layer_traces.h"

#include "launcher/model_factory.h"
#include "launcher/planning/profile_parts.h"
#include "alloc/cpu_arena.h"
#include "alloc/gradient_buffer.h"
#include "alloc/meta_arena.h"
#include "models/layers.h"
#include "parallel/communicator.h"
#include "parallel/data_parallel.h"

#include <map>
#include <set>

namespace ht {
namespace {

// Each block's gradient buckets (cut at blocks) in reduction order; -1: parameters in no block.
std::map<int, std::vector<int>> buckets_by_block(const Model& model,
                                                 const std::unordered_map<const c10::TensorImpl*, size_t>& bucket_of) {
  const std::vector<at::Tensor> params = model.parameters();
  const std::vector<int> blocks = model.parameter_blocks();
  std::map<int, std::set<int>> sets;
  for (size_t i = 0; i < params.size(); ++i) {
    auto it = bucket_of.find(params[i].unsafeGetTensorImpl());
    if (it != bucket_of.end()) sets[blocks[i]].insert(static_cast<int>(it->second));
  }
  std::map<int, std::vector<int>> out;
  for (const auto& [block, buckets] : sets) out[block].assign(buckets.begin(), buckets.end());
  return out;
}

// The first layer's block: the decoder's blocks are the embedding, the layers, the head.
int first_layer(const Model& model) {
  const std::vector<std::string>& names = model.block_names();
  for (size_t b = 0; b < names.size(); ++b)
    if (names[b] == "h0") return static_cast<int>(b);
  return -1;
}

}  // namespace

struct LayerTraces::Shallow {
  Config config;
  std::shared_ptr<Model> model;
  std::unique_ptr<GradientBuffer> gradients;
  std::unordered_map<const c10::TensorImpl*, size_t> bucket_of;
  std::map<int, std::vector<int>> buckets;

  Shallow(const Config& deep, const DataInfo& info, int64_t layers) : config(deep) {
    config.model.n_layer = layers;
    {
      MetaParametersScope on_meta;
      model = make_model(config, info, /*tensor_rank=*/0);
    }
    ModelProfile unused;
    bucket_of = record_block_buckets(*model, config.parallel.bucket_mb << 20, unused);
    buckets = buckets_by_block(*model, bucket_of);
    gradients = std::make_unique<GradientBuffer>(
        DataParallel(std::make_shared<LocalCommunicator>(), model->parameters(), config.parallel.bucket_mb << 20).reduction_order());
  }

  TracedStep step(const Config& c, const std::shared_ptr<CpuArena>& arena, const DataInfo& info, int64_t micro,
                  TraceExtras& extras) const {
    Config shallow = c;
    shallow.model.n_layer = config.model.n_layer;
    extras.gradients = gradients.get();
    extras.bucket_of = &bucket_of;
    TracedStep out;
    const auto [x, y] = traced_batch(info, micro, /*meta=*/true, c.parallel.context_parallel);
    trace_forward_backward(shallow, *model, arena, x, y, out, &extras);
    return out;
  }
};

LayerTraces::~LayerTraces() = default;

std::unique_ptr<LayerTraces> LayerTraces::make(const Config& config, const DataInfo& info, const Model& deep,
                                               const std::unordered_map<const c10::TensorImpl*, size_t>& deep_buckets,
                                               int64_t beyond) {
  if (!is_decoder(config.model.name) || config.model.n_layer <= std::max(beyond, LayerTraces::kTraced + 1)) return nullptr;
  const int first = first_layer(deep);
  CpuArena* arena = active_meta_arena();
  if (first < 0 || arena == nullptr) return nullptr;
  std::unique_ptr<LayerTraces> out(new LayerTraces());
  const int64_t before = arena->stats().in_use;
  out->three_ = std::make_unique<Shallow>(config, info, LayerTraces::kTraced);
  out->four_ = std::make_unique<Shallow>(config, info, LayerTraces::kTraced + 1);
  out->shallow_bytes_ = arena->stats().in_use - before;
  out->layers_ = config.model.n_layer;
  for (LayerRepeat* r : {&out->to_four_, &out->to_deep_}) {
    r->first = first;
    r->layers = static_cast<int>(LayerTraces::kTraced);
    r->shallow_buckets = out->three_->buckets;
  }
  out->to_four_.target_layers = static_cast<int>(LayerTraces::kTraced + 1);
  out->to_four_.deep_buckets = out->four_->buckets;
  out->to_deep_.target_layers = static_cast<int>(config.model.n_layer);
  out->to_deep_.deep_buckets = buckets_by_block(deep, deep_buckets);
  return out;
}

bool LayerTraces::trace(const Config& config, const std::shared_ptr<CpuArena>& arena, const DataInfo& info,
                        int64_t micro, TracedStep& out, TraceExtras& extras) {
  auto refuse = [&](const std::string& why) {
    why_ = "traced whole, not from " + std::to_string(LayerTraces::kTraced) + " layers: " + why;
    return false;
  };
  TraceExtras three_extras, four_extras;
  const TracedStep three = three_->step(config, arena, info, micro, three_extras);
  const TracedStep four = four_->step(config, arena, info, micro, four_extras);
  std::string why;
  StepTrace stretched = repeat_layers(three.trace, to_four_, why);
  if (!why.empty()) return refuse(why);
  stretched.persistent_bytes = four.trace.persistent_bytes;
  std::string difference;
  if (!same_step(stretched, four.trace, &difference))
    return refuse("stretched to " + std::to_string(LayerTraces::kTraced + 1) + " layers, it differs at " + difference);
  if (live_peak_bytes(four.trace) != four.step_peak_bytes) return refuse("its live bytes are not the arena's peak");
  if (repeat_buckets(three_extras.backward_read_buckets, to_four_) != four_extras.backward_read_buckets ||
      repeat_buckets(three_extras.half_read_buckets, to_four_) != four_extras.half_read_buckets ||
      repeat_buckets(three_extras.backward_copy_buckets, to_four_) != four_extras.backward_copy_buckets ||
      repeat_buckets(three_extras.backward_fp32_buckets, to_four_) != four_extras.backward_fp32_buckets ||
      repeat_bucket_elements(three_extras.fp32_read_elements, to_four_) != four_extras.fp32_read_elements)
    return refuse("backward's buckets do not stretch");
  out.trace = repeat_layers(three.trace, to_deep_, why);
  if (!why.empty()) return refuse(why);
  out.trace.persistent_bytes = three.trace.persistent_bytes - shallow_bytes_;
  out.step_peak_bytes = live_peak_bytes(out.trace);
  extras.backward_read_buckets = repeat_buckets(three_extras.backward_read_buckets, to_deep_);
  extras.half_read_buckets = repeat_buckets(three_extras.half_read_buckets, to_deep_);
  extras.backward_copy_buckets = repeat_buckets(three_extras.backward_copy_buckets, to_deep_);
  extras.backward_fp32_buckets = repeat_buckets(three_extras.backward_fp32_buckets, to_deep_);
  extras.fp32_read_elements = repeat_bucket_elements(three_extras.fp32_read_elements, to_deep_);
  extras.seed_counter = three_extras.seed_counter;
  return true;
}

}  // namespace ht

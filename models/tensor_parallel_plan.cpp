#include "models/tensor_parallel_plan.h"

namespace ht {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::vector<LayerSplit> decoder_parallel_plan(const DecoderOptions& o) {
  const int64_t hd = o.head_dim(), q = o.n_head * hd, kv = o.kv_heads() * hd, f = o.mlp_hidden();
  std::vector<LayerSplit> plan{
      {"embed.wte", ParallelStyle::kVocabulary, {o.padded_vocab()}},
      {"attn.wqkv", ParallelStyle::kColumnwise, {q, kv, kv}},
      {"attn.wo", ParallelStyle::kRowwise, {q}},
  };
  if (o.is_llama()) {
    plan.push_back({"mlp.w13", ParallelStyle::kColumnwise, {f, f}});
    plan.push_back({"mlp.w2", ParallelStyle::kRowwise, {f}});
  } else {
    plan.push_back({"mlp.fc", ParallelStyle::kColumnwise, {f}});
    plan.push_back({"mlp.proj", ParallelStyle::kRowwise, {f}});
  }
  plan.push_back({"head.lm_head", ParallelStyle::kVocabulary, {o.padded_vocab()}});
  return plan;
}

LayerSplit layer_split_of(const DecoderOptions& o, const std::string& path) {
  for (LayerSplit& entry : decoder_parallel_plan(o)) {
    if (path == entry.layer || ends_with(path, "." + entry.layer)) return entry;
  }
  return LayerSplit{path};
}

}  // namespace ht

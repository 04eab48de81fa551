#include "launcher/planning/profile_parts.h"

#include "launcher/model_factory.h"
#include "parallel/communicator.h"
#include "parallel/data_parallel.h"

#include <algorithm>
#include <map>
#include <set>

namespace ht {

ModelProfile job_profile(const Config& config, const DataInfo& info, int64_t train_samples) {
  ModelProfile profile;
  profile.model = choice_name(config.model.name);
  profile.optimizer = choice_name(config.training.optimizer);
  profile.global_batch = config.training.global_batch_size;
  profile.train_samples = train_samples;
  if (info.task == Task::kLanguageModel && !info.sample_shape.empty()) profile.tokens_per_sample = info.sample_shape[0];
  profile.steps_per_epoch = std::max<int64_t>(1, train_samples / std::max<int64_t>(1, profile.global_batch));
  profile.tensor_parallel = static_cast<int>(config.parallel.tensor_parallel);
  profile.sequence_parallel = profile.tensor_parallel > 1 && config.parallel.sequence_parallel;
  profile.context_parallel = static_cast<int>(config.parallel.context_parallel);
  profile.context_exchange = config.parallel.context_exchange;
  if (is_decoder(config.model.name)) {
    DecoderOptions o = decoder_options(config.model, info.classes);
    o.tensor_parallel = config.parallel.tensor_parallel;
    profile.tensor_shape = tensor_shape(o);
  }
  return profile;
}

void describe_model(const Config& config, const Model& model, ModelProfile& profile) {
  profile.parameters = model.num_parameters();
  profile.parameter_bytes = arena_tensor_bytes(model.parameters()) + arena_tensor_bytes(model.buffers());
  for (const auto& block : model.blocks()) profile.block_parameter_bytes.push_back(arena_tensor_bytes(block->parameters()));
  const std::vector<at::Tensor> params = model.parameters();
  const std::vector<int> registered_by = model.parameter_blocks();
  std::unordered_map<const c10::TensorImpl*, int> index;
  for (size_t i = 0; i < params.size(); ++i) index.emplace(params[i].unsafeGetTensorImpl(), static_cast<int>(i));
  const std::vector<std::vector<at::Tensor>> reads = model.parameters_read_by_blocks();
  profile.block_tied_reads.assign(reads.size(), {});
  for (size_t b = 0; b < reads.size(); ++b) {
    for (const at::Tensor& w : reads[b]) {
      auto it = index.find(w.unsafeGetTensorImpl());
      if (it == index.end()) continue;
      const int owner = registered_by[static_cast<size_t>(it->second)];
      if (owner < 0 || owner == static_cast<int>(b)) continue;
      profile.block_tied_reads[b].push_back({it->second, owner, arena_tensor_bytes({w})});
    }
  }
  profile.buckets = DataParallel(std::make_shared<LocalCommunicator>(), model.parameters(), config.parallel.bucket_mb << 20)
                        .bucket_elements();
}

int64_t arena_tensor_bytes(const std::vector<at::Tensor>& tensors) {
  int64_t bytes = 0;
  for (const at::Tensor& t : tensors) bytes += arena_bytes(static_cast<int64_t>(t.storage().nbytes()));
  return bytes;
}

std::unordered_map<const c10::TensorImpl*, size_t> record_block_buckets(const Model& model, int64_t bucket_bytes,
                                                                        ModelProfile& profile) {
  const std::vector<at::Tensor> params = model.parameters();
  const DataParallel cut(std::make_shared<LocalCommunicator>(), params, bucket_bytes, false, model.parameter_blocks());
  profile.block_buckets = cut.bucket_elements();
  std::unordered_map<const c10::TensorImpl*, size_t> bucket_of;
  const std::vector<std::vector<size_t>> buckets = cut.buckets();
  for (size_t b = 0; b < buckets.size(); ++b)
    for (size_t k : buckets[b]) bucket_of[params[k].unsafeGetTensorImpl()] = b;
  profile.block_bucket_uses.clear();
  for (const std::vector<at::Tensor>& read : model.parameters_read_by_blocks()) {
    std::vector<size_t> uses;
    for (const at::Tensor& p : read) {
      auto it = bucket_of.find(p.unsafeGetTensorImpl());
      if (it != bucket_of.end() && std::find(uses.begin(), uses.end(), it->second) == uses.end()) uses.push_back(it->second);
    }
    profile.block_bucket_uses.push_back(std::move(uses));
  }
  return bucket_of;
}

std::vector<size_t> buckets_read(const std::unordered_set<const c10::TensorImpl*>& read,
                                 const std::unordered_map<const c10::TensorImpl*, size_t>& bucket_of) {
  std::set<size_t> buckets;
  for (const c10::TensorImpl* w : read) {
    auto it = bucket_of.find(w);
    if (it != bucket_of.end()) buckets.insert(it->second);
  }
  return {buckets.begin(), buckets.end()};
}

void precision_reads(const BackwardReads& reads, const std::unordered_map<const c10::TensorImpl*, size_t>& bucket_of,
                     std::vector<size_t>& half_read_buckets, std::vector<std::pair<size_t, int64_t>>& fp32_read_elements) {
  std::set<size_t> half;
  std::map<size_t, int64_t> fp32;
  for (const auto& [w, n] : reads.reads) {
    auto bucket = bucket_of.find(w);
    if (bucket == bucket_of.end()) continue;
    auto cast = reads.casts.find(w);
    const int64_t casts = cast == reads.casts.end() ? 0 : cast->second;
    if (casts > 0) half.insert(bucket->second);
    if (n > casts) fp32[bucket->second] += w->numel();
  }
  half_read_buckets.assign(half.begin(), half.end());
  fp32_read_elements.assign(fp32.begin(), fp32.end());
}

}  // namespace ht

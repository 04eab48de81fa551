#include "launcher/planning/profile_parts.h"

#include "parallel/communicator.h"
#include "parallel/data_parallel.h"

#include <algorithm>
#include <set>

namespace ht {

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

}  // namespace ht

#include "training/sampler.h"

#include "base/user_error.h"

#include <ATen/CPUGeneratorImpl.h>

namespace ht {

Sampler::Sampler(int64_t dataset_size, int64_t global_batch, uint64_t seed, bool shuffle, int64_t rank,
                 int64_t world)
    : size_(dataset_size), global_batch_(global_batch), seed_(seed), shuffle_(shuffle), rank_(rank),
      world_(world) {
  if (size_ < global_batch_) {
    throw UserError("data: " + std::to_string(size_) + " training samples are fewer than training.global_batch_size = " +
                    std::to_string(global_batch_) + "; use a smaller batch or more data");
  }
  TORCH_INTERNAL_ASSERT(world_ >= 1 && rank_ >= 0 && rank_ < world_ && global_batch_ % world_ == 0,
                        "Sampler: bad rank/world for the global batch");
}

const at::Tensor& Sampler::order() {
  if (order_epoch_ != pos_.epoch) {
    if (shuffle_) {
      at::Generator gen = at::detail::createCPUGenerator(seed_ * 0x9E3779B97F4A7C15ull + 0x5A3D + pos_.epoch);
      order_ = at::randperm(size_, gen, at::kLong);
    } else {
      order_ = at::arange(size_, at::kLong);
    }
    order_epoch_ = pos_.epoch;
  }
  return order_;
}

at::Tensor Sampler::next() {
  if (pos_.batch >= batches_per_epoch()) {
    ++pos_.epoch;
    pos_.batch = 0;
  }
  const int64_t per_rank = global_batch_ / world_;
  at::Tensor indices = order().narrow(0, pos_.batch * global_batch_ + rank_ * per_rank, per_rank);
  ++pos_.batch;
  return indices;
}

void Sampler::seek(SamplerPosition position) {
  TORCH_INTERNAL_ASSERT(position.epoch >= 0 && position.batch >= 0 && position.batch <= batches_per_epoch(),
                        "Sampler::seek: position out of range");
  pos_ = position;
}

}  // namespace ht

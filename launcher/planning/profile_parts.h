#pragma once
// What both ways of making a ModelProfile share (launcher/planning/profiler.h measures a step,
// launcher/planning/trace_profile.h traces one on meta tensors): the buckets sharded parameters
// are gathered in, and which weights backward reads again.

#include "launcher/config/config.h"
#include "launcher/data/dataset.h"
#include "models/model.h"
#include "planner/profile.h"
#include "alloc/weight_copies.h"
#include "runtime/parameter_source.h"

#include <unordered_map>
#include <unordered_set>

namespace ht {

// What a profile knows of the job before anything is measured or traced: names, batch, epoch,
// the tensor-parallel part and a decoder's shape. `train_samples`: the training set's size (0:
// not read).
ModelProfile job_profile(const Config& config, const DataInfo& info, int64_t train_samples);
// The model's own figures: parameters, their arena bytes in all and per block, and the buckets
// sharding splits at the job's bucket size.
void describe_model(const Config& config, const Model& model, ModelProfile& profile);

// The arena bytes `tensors`' storages take (each block rounded as the arena rounds).
int64_t arena_tensor_bytes(const std::vector<at::Tensor>& tensors);

// Which weights backward reads (asked as sharded parameters would ask): every read after the
// last block's forward, until the next forward begins; and the weights the tape saved, as they are
// and as casts (what a step keeping copies reads again). It gathers nothing. As the interpreter's
// ComputeWeights it gives no copy (the step casts, as the profile prices it) but counts the casts:
// a weight's reads less its casts are its reads in fp32, what 16-bit gathers leave to fp32 ones.
class BackwardReads final : public ParameterSource, public ComputeWeights {
 public:
  void before_read(const at::Tensor& weight, MemoryHooks&, uint64_t) override {
    if (in_backward) read.insert(weight.unsafeGetTensorImpl());
    // A kernel's reads, once each (a weight is asked for as it is made resident and as it is read).
    if (!frames_.empty() && frames_.back().insert(weight.unsafeGetTensorImpl()).second) ++reads[weight.unsafeGetTensorImpl()];
  }
  void backward_will_read(const std::vector<at::Tensor>& weights) override {
    for (const at::Tensor& w : weights) saved.insert(w.unsafeGetTensorImpl());
  }
  void backward_will_read_casts_of(const std::vector<at::Tensor>& weights) override {
    for (const at::Tensor& w : weights) casts_saved.insert(w.unsafeGetTensorImpl());
  }
  void begin_reads() override { frames_.emplace_back(); }
  void end_reads() override { frames_.pop_back(); }
  at::Tensor copy_of(const at::Tensor& weight, at::ScalarType) override {
    ++casts[weight.unsafeGetTensorImpl()];
    return {};
  }
  void weights_changed() override {}
  int64_t bytes() const override { return 0; }
  int64_t made_last_step() const override { return 0; }
  bool in_backward = false;
  std::unordered_set<const c10::TensorImpl*> read;
  // The weights the tape saved as they are (read in fp32), and those whose casts it saved.
  std::unordered_set<const c10::TensorImpl*> saved, casts_saved;
  // Of casts_saved, autocast's (those it asked a copy of): what a step keeping copies reads
  // again as its copies (a cast the model makes itself is made at each read in either step).
  std::unordered_set<const c10::TensorImpl*> copies_saved() const {
    std::unordered_set<const c10::TensorImpl*> out;
    for (const c10::TensorImpl* w : casts_saved)
      if (casts.count(w) > 0) out.insert(w);
    return out;
  }
  std::unordered_map<const c10::TensorImpl*, int64_t> reads, casts;

 private:
  std::vector<std::unordered_set<const c10::TensorImpl*>> frames_;
};

// What 16-bit gathers (parallel/parameter_shards.h, keep_copies) gather of each bucket: the buckets
// holding a weight cast (ProfilePoint::half_read_buckets), and the elements of the weights read
// in fp32 (ProfilePoint::fp32_read_elements).
void precision_reads(const BackwardReads& reads, const std::unordered_map<const c10::TensorImpl*, size_t>& bucket_of,
                     std::vector<size_t>& half_read_buckets, std::vector<std::pair<size_t, int64_t>>& fp32_read_elements);

// The buckets sharded parameters use (cut where blocks end) and which of them each block reads;
// returns each parameter's bucket.
std::unordered_map<const c10::TensorImpl*, size_t> record_block_buckets(const Model& model, int64_t bucket_bytes,
                                                                        ModelProfile& profile);
// The buckets (record_block_buckets' `bucket_of`) holding the weights backward read: a point's
// backward_read_buckets.
std::vector<size_t> buckets_read(const std::unordered_set<const c10::TensorImpl*>& read,
                                 const std::unordered_map<const c10::TensorImpl*, size_t>& bucket_of);

}  // namespace ht

#pragma once
// The gradient syncs of training/gradient_sync.h over the data-parallel group's mechanisms
// (parallel/): the all-reduce of whole buckets, ZeRO-2/3's reduce-scatters, and a pipeline
// stage's tied weights.

#include "parallel/gradient_shards.h"
#include "parallel/parameter_shards.h"
#include "parallel/pipeline_stage.h"
#include "training/gradient_sync.h"

#include <memory>

namespace ht {

// Data parallelism (and ZeRO-1, which shards only the optimizer's state): each bucket's
// all-reduce starts when the last micro-batch's backward has finished its gradients (on a worker
// thread, with parallel.overlap), the rest after backward; then every gradient is the replicas'
// mean.
class AllReduceSync final : public GradientSync {
 public:
  explicit AllReduceSync(DataParallel& replicas) : replicas_(replicas) {}
  GradientListener* listener(bool last) override { return last && replicas_.overlaps() ? &replicas_ : nullptr; }
  std::unique_ptr<SyncHandle> begin() override;
  DataParallelStats stats() const override { return replicas_.stats(); }
  void record(JsonObject& record) const override;

 private:
  DataParallel& replicas_;
};

// ZeRO-2 (gradients) and ZeRO-3 (parameters): every micro-batch's backward reduce-scatters each
// bucket as it finishes it; after the last, which parameters had a gradient anywhere, and the
// sums become this rank's share of the means. At ZeRO-3 `parameters` releases each bucket's
// gathered parameters once its gradients are reduce-scattered, and all of them after each
// backward, so that the next forward gathers from its first block.
class ShardedSync final : public GradientSync {
 public:
  ShardedSync(std::shared_ptr<GradientShards> shards, std::shared_ptr<ParameterShards> parameters);
  GradientListener* listener(bool) override { return shards_.get(); }
  void backward_ended() override;
  std::unique_ptr<SyncHandle> begin() override;
  DataParallelStats stats() const override { return shards_->stats(); }
  void record(JsonObject& record) const override;
  const GradientShards& shards() const { return *shards_; }

 private:
  std::shared_ptr<GradientShards> shards_;
  std::shared_ptr<ParameterShards> parameters_;  // null below ZeRO-3
};

// A pipeline stage: a tied weight's two gradients (first and last stage) summed on both, then the
// stage's replicas' sync over the stage's own parameters.
class PipelineSync final : public GradientSync {
 public:
  PipelineSync(std::shared_ptr<PipelineStage> stage, std::unique_ptr<GradientSync> replicas)
      : stage_(std::move(stage)), replicas_(std::move(replicas)) {}
  GradientListener* listener(bool last) override { return replicas_->listener(last); }
  void backward_ended() override { replicas_->backward_ended(); }
  std::unique_ptr<SyncHandle> begin() override;
  DataParallelStats stats() const override { return replicas_->stats(); }
  void record(JsonObject& record) const override { replicas_->record(record); }

 private:
  std::shared_ptr<PipelineStage> stage_;
  std::unique_ptr<GradientSync> replicas_;
};

}  // namespace ht

#include "training/gradient_syncs.h"

namespace ht {
namespace {

// The replicas' means are written when the buckets under way are done.
class AverageHandle final : public SyncHandle {
 public:
  explicit AverageHandle(DataParallel& replicas) : replicas_(replicas) {}
  void wait() override { replicas_.finish_average(); }

 private:
  DataParallel& replicas_;
};

void add_comm_fields(JsonObject& record, const DataParallelStats& s) {
  record.add("buckets", s.buckets).add("buckets_started_in_backward", s.started_in_backward);
  record.add("comm_ms", s.comm_ms).add("comm_bytes", s.comm_bytes).add("overlap", s.overlap);
}

}  // namespace

std::unique_ptr<SyncHandle> AllReduceSync::begin() {
  replicas_.begin_average();
  return std::make_unique<AverageHandle>(replicas_);
}

void AllReduceSync::record(JsonObject& record) const {
  if (replicas_.size() > 1) add_comm_fields(record, replicas_.stats());
}

ShardedSync::ShardedSync(std::shared_ptr<GradientShards> shards, std::shared_ptr<ParameterShards> parameters)
    : shards_(std::move(shards)), parameters_(std::move(parameters)) {
  if (parameters_) shards_->set_bucket_done([p = parameters_.get()](size_t b) { p->bucket_done(b); });
}

void ShardedSync::backward_ended() {
  shards_->backward_ended();
  if (parameters_) parameters_->release_all();  // the next forward gathers from its first block
}

std::unique_ptr<SyncHandle> ShardedSync::begin() {
  shards_->finish_step();  // the reduce-scatters were begun by every backward; the flags' all-reduce waits
  return std::make_unique<DoneHandle>();
}

void ShardedSync::record(JsonObject& record) const { add_comm_fields(record, shards_->stats()); }

std::unique_ptr<SyncHandle> PipelineSync::begin() {
  stage_->sum_tied_gradients();
  return replicas_->begin();
}

}  // namespace ht

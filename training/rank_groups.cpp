#include "training/rank_groups.h"

#include "alloc/cpu_device_allocator.h"
#include "training/per_rank.h"

#include <cmath>

namespace ht {

RankGroups::RankGroups(std::unique_ptr<DataParallel> replicas, std::shared_ptr<Communicator> pipeline,
                       std::unique_ptr<TensorGroup> tensor, double timeout_s, std::unique_ptr<TensorGroup> context)
    : replicas_(std::move(replicas)), pipeline_(std::move(pipeline)), tensor_(std::move(tensor)),
      context_(std::move(context)), stage_(pipeline_ ? pipeline_->rank() : 0) {
  replicas_->group().set_timeout(timeout_s);
  if (pipeline_) pipeline_->set_timeout(timeout_s);
  if (tensor_) tensor_->communicator().set_timeout(timeout_s);
  if (context_) context_->communicator().set_timeout(timeout_s);
}

bool RankGroups::first_rank() const {
  return replicas_->rank() == 0 && (!pipeline_ || pipeline_->rank() == 0) && (!tensor_ || tensor_->rank() == 0);
}

void RankGroups::step_begins(int64_t step) {
  const std::string name = "step " + std::to_string(step);
  replicas_->group().set_context(name);
  if (tensor_) tensor_->communicator().set_context(name);
  if (context_) context_->communicator().set_context(name);
  if (pipeline_) pipeline_->set_context(name + ", stage " + std::to_string(stage_));
  if (tensor_) tensor_at_step_ = tensor_->stats();
  if (context_) context_at_step_ = context_->stats();
}

std::vector<std::vector<double>> RankGroups::per_replica(const std::vector<double>& mine, const char* what) {
  if (replicas_->size() == 1) return {};
  return gather_per_rank(replicas_->group(), mine, what);
}

void RankGroups::sum_evaluation(at::Tensor& sums, int64_t step) {
  if (replicas_->size() == 1 && !pipeline_) return;
  const std::string context = "evaluation after step " + std::to_string(step);
  replicas_->group().set_context(context);
  if (pipeline_) {  // the last stage has the sums; the others add zeros, exactly
    pipeline_->set_context(context);
    pipeline_->allreduce_sum(sums, "the evaluation");
  }
  replicas_->group().allreduce_sum(sums, "the evaluation");
}

void RankGroups::record(JsonObject& record) const {
  if (tensor_) {
    const TensorGroupStats& now = tensor_->stats();
    record.add("tensor_bytes", now.bytes - tensor_at_step_.bytes)
        .add("tensor_recomputed_bytes", now.recomputed_bytes - tensor_at_step_.recomputed_bytes);
  }
  if (context_) {
    const TensorGroupStats& now = context_->stats();
    record.add("context_bytes", now.bytes - context_at_step_.bytes)
        .add("context_recomputed_bytes", now.recomputed_bytes - context_at_step_.recomputed_bytes);
  }
}

int RankGroups::agreed_stop_signal(int mine) {
  if (alone()) return mine;
  // [ranks that received one, the sum of their signals], summed over the replicas of this stage,
  // then over the stages: every rank of the job sees the same sums.
  at::Tensor votes;
  {
    HostAllocationScope host;  // a collective's buffer, not device memory
    votes = at::tensor({mine != 0 ? 1.0f : 0.0f, static_cast<float>(mine)});
  }
  replicas_->group().allreduce_sum(votes, "the stop request");
  if (pipeline_) pipeline_->allreduce_sum(votes, "the stop request");
  if (tensor_) tensor_->communicator().allreduce_sum(votes, "the stop request");
  const float ranks = votes[0].item<float>();
  if (ranks == 0) return 0;
  return mine != 0 ? mine : static_cast<int>(std::lround(votes[1].item<float>() / ranks));
}

bool RankGroups::every_rank(bool mine, const char* what) {
  if (alone()) return mine;
  at::Tensor not_yet;
  {
    HostAllocationScope host;  // a collective's buffer, not device memory
    not_yet = at::tensor({mine ? 0.0f : 1.0f});
  }
  replicas_->group().allreduce_sum(not_yet, what);
  if (pipeline_) pipeline_->allreduce_sum(not_yet, what);
  if (tensor_) tensor_->communicator().allreduce_sum(not_yet, what);
  return not_yet.item<float>() == 0;
}

void RankGroups::barrier(const char* what) {
  replicas_->group().barrier(what);
  if (pipeline_) pipeline_->barrier(what);
  if (tensor_) tensor_->communicator().barrier(what);
}

}  // namespace ht

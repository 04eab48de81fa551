#pragma once
// The groups a rank trains in, in the one order every rank uses them: its data-parallel replicas
// (DataParallel: a group of one without replicas), its pipeline (none without stages) and its
// tensor-parallel group (none without). What the trainer asks of all of them at once goes through
// here (a step's name for error messages, the stop vote, a barrier), so that it never asks which
// of them exist.

#include "base/json.h"
#include "parallel/data_parallel.h"
#include "parallel/tensor_group.h"

#include <memory>
#include <string>
#include <vector>

namespace ht {

class RankGroups {
 public:
  // `pipeline`, `tensor` and `context`: null where the grid has no such axis. `replicas` are the
  // ranks with this rank's weights: every data-parallel replica's context ranks.
  RankGroups(std::unique_ptr<DataParallel> replicas, std::shared_ptr<Communicator> pipeline,
             std::unique_ptr<TensorGroup> tensor, double timeout_s, std::unique_ptr<TensorGroup> context = nullptr);

  DataParallel& replicas() { return *replicas_; }
  const DataParallel& replicas() const { return *replicas_; }
  Communicator* pipeline() const { return pipeline_.get(); }
  const std::shared_ptr<Communicator>& shared_pipeline() const { return pipeline_; }
  TensorGroup* tensor() const { return tensor_.get(); }
  TensorGroup* context() const { return context_.get(); }
  // Whether the model's layers exchange with a group while forward and backward run.
  bool exchanges_in_layers() const { return tensor_ || context_; }
  // One rank in all: no collective needed.
  bool alone() const { return replicas_->size() == 1 && !pipeline_ && !tensor_; }
  // Rank 0 of the job: the one that prints and writes the outputs.
  bool first_rank() const;

  // Names the step in any collective's error ("rank 3, step 12, stage 1: ...").
  void step_begins(int64_t step);
  // The signal any rank received (0: none), agreed by all: the same answer on every rank.
  int agreed_stop_signal(int mine);
  void barrier(const char* what);
  // Whether `mine` is true on every rank of the job: the same answer on every rank.
  bool every_rank(bool mine, const char* what);
  // Per replica (a collective of the replicas): row i holds every replica's mine[i]; none with
  // one replica.
  std::vector<std::vector<double>> per_replica(const std::vector<double>& mine, const char* what);
  // The replicas' and stages' sums of an evaluation's numbers (each stage but the last adds zeros).
  void sum_evaluation(at::Tensor& sums, int64_t step);
  // Its fields of a step's metrics record: the bytes this rank handed its tensor-parallel and
  // context-parallel collectives since step_begins, and of them what recomputations repeated.
  void record(JsonObject& record) const;

 private:
  std::unique_ptr<DataParallel> replicas_;
  std::shared_ptr<Communicator> pipeline_;
  std::unique_ptr<TensorGroup> tensor_;
  std::unique_ptr<TensorGroup> context_;  // its ranks are also among the replicas: no vote of its own
  int stage_ = 0;
  TensorGroupStats tensor_at_step_, context_at_step_;  // the groups' counts when the step began
};

}  // namespace ht

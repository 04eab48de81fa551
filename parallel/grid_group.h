#pragma once
// The whole job as one group, made of the two groups a rank already has (parallel/process_grid.h):
// its stage's data-parallel group and its replica's pipeline. Rank stage x replicas + replica,
// as the grid numbers the world. For what every rank of a job does together but rarely: a
// checkpoint of sharded pipeline stages, whose slices each rank writes and whose sizes every rank
// must agree on. It sums, broadcasts and waits; what has no meaning across two groups (a sharded
// collective's counts, point-to-point by world rank) it refuses with CommunicationError.

#include "parallel/communicator.h"

#include <memory>
#include <string>

namespace ht {

class GridGroup final : public Communicator {
 public:
  // Both groups must outlive it.
  GridGroup(Communicator& replicas, Communicator& pipeline);

  int rank() const override { return pipeline_.rank() * replicas_.size() + replicas_.rank(); }
  int size() const override { return replicas_.size() * pipeline_.size(); }
  // Over the stage's replicas, then along the replica's pipeline: every rank ends with the world's sum.
  void allreduce_sum(at::Tensor& t, const char* what) override;
  // Along the root's replica index from its stage, then from that replica in every stage.
  void broadcast(at::Tensor& t, int root, const char* what) override;
  void barrier(const char* what) override;
  void idle_barrier(const char* what) override;
  void reduce_scatter_sum(const at::Tensor&, at::Tensor&, const std::vector<int64_t>&, const char* what) override;
  void all_gather(const at::Tensor&, at::Tensor&, const std::vector<int64_t>&, const char* what) override;
  void send(const at::Tensor&, int to, const char* what) override;
  void recv(at::Tensor&, int from, const char* what) override;
  std::unique_ptr<Transfer> isend(const at::Tensor&, int to, int tag, const std::string& what) override;
  std::unique_ptr<Transfer> irecv(at::Tensor&, int from, int tag, const std::string& what) override;
  std::string backend() const override { return replicas_.backend() + " x " + pipeline_.backend(); }
  bool allows_worker_thread() const override { return false; }

 private:
  [[noreturn]] void refuse(const char* collective, const std::string& what) const;
  Communicator &replicas_, &pipeline_;
};

}  // namespace ht

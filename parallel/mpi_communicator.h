#pragma once
// Communicator over an MPI communicator, for CPU tensors (float, double, int64). MPI errors are
// returned, not fatal, and reported with the rank and the collective.

#include "parallel/communicator.h"

#include <mpi.h>

namespace ht {

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm`. `world_rank` names this process in error messages.
  MpiCommunicator(MPI_Comm comm, int world_rank);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void allreduce_sum(at::Tensor& t, const char* what) override;
  void broadcast(at::Tensor& t, int root, const char* what) override;
  void barrier(const char* what) override;
  std::string backend() const override { return "mpi"; }

 private:
  void check(int rc, const char* collective, const char* what) const;
  // Polls a nonblocking collective to completion or to the timeout.
  void wait(MPI_Request& request, const char* collective, const char* what) const;
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1, world_rank_ = 0;
};

}  // namespace ht

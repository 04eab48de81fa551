#pragma once
// A pipeline group over MPI that carries its messages as NCCL does, so that CPU ranks run what a
// GPU run would (parallel.pipeline_p2p = "nccl_like"; issue 67). NCCL, unlike MPI:
// - matches the messages of one directed link in the order they are posted, not by tag: here
//   each link is one channel (one MPI tag), so they match in posting order too;
// - completes a send only when its receive is running (MPI_Issend here);
// - runs a rank's calls one after another on its stream: here every call holds the calling thread
//   (a CPU rank's stream) until it has completed, so a receive posted ahead of the send its peer
//   makes later deadlocks as it would on NCCL;
// - progresses the calls of one group independently (post_group): here they are posted together
//   and complete together.
// Each message carries its identity (tag, bytes, words) and the receiver checks it against what
// it expected: where NCCL would hand over the wrong tensor, this names both messages. A group not
// complete within the timeout throws CommunicationError naming the rank, the context and the calls
// still waiting: on NCCL it would wait for ever. Collectives go to the MPI group it wraps. Device
// tensors cross through host copies, as MpiCommunicator's do.

#include "parallel/communicator.h"
#include "parallel/mpi_communicator.h"

#include <memory>
#include <string>
#include <vector>

namespace ht {

class NcclLikeCommunicator final : public Communicator {
 public:
  // Collective over `inner`'s ranks (it duplicates their MPI communicator for its links).
  explicit NcclLikeCommunicator(std::shared_ptr<MpiCommunicator> inner);
  ~NcclLikeCommunicator() override;
  NcclLikeCommunicator(const NcclLikeCommunicator&) = delete;
  NcclLikeCommunicator& operator=(const NcclLikeCommunicator&) = delete;

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  void allreduce_sum(at::Tensor& t, const char* what) override;
  void broadcast(at::Tensor& t, int root, const char* what) override;
  void barrier(const char* what) override;
  void idle_barrier(const char* what) override;
  void reduce_scatter_sum(const at::Tensor& full, at::Tensor& shard, const std::vector<int64_t>& counts,
                          const char* what) override;
  void all_gather(const at::Tensor& shard, at::Tensor& full, const std::vector<int64_t>& counts,
                  const char* what) override;
  // Each a group of one: it returns when its message has crossed (a send, when it was received).
  void send(const at::Tensor& t, int to, const char* what) override;
  void recv(at::Tensor& t, int from, const char* what) override;
  std::unique_ptr<Transfer> isend(const at::Tensor& t, int to, int tag, const std::string& what) override;
  std::unique_ptr<Transfer> irecv(at::Tensor& t, int from, int tag, const std::string& what) override;
  // Returns when every message of the group has crossed.
  std::unique_ptr<Transfer> post_group(std::vector<PeerMessage> messages) override;
  bool matches_by_tag() const override { return false; }
  std::string backend() const override { return "mpi, nccl_like"; }
  bool allows_worker_thread() const override { return inner_->allows_worker_thread(); }
  void set_timeout(double seconds) override;

 private:
  Communicator& synced();  // inner_, with this one's context
  [[noreturn]] void fail(const std::string& why) const;

  std::shared_ptr<MpiCommunicator> inner_;
  MPI_Comm links_ = MPI_COMM_NULL;
};

}  // namespace ht

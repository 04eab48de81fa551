#pragma once
// Communicator over an MPI communicator, for CPU tensors (float, double, int32, int64); a device
// tensor crosses through a host copy (several ranks sharing one GPU, which NCCL refuses:
// launcher/device_group.h). MPI
// errors are returned, not fatal, and reported with the rank and the collective. Collectives are
// MPI's blocking ones (Open MPI's nonblocking all-reduce measured 30-45% slower here); a watchdog
// thread ends the process, naming the rank, the context and the collective, when one has not
// returned within the timeout, and mpirun then ends the job. Before it does, it calls the roll
// (where MPI gives MPI_THREAD_MULTIPLE): on a duplicate of the communicator, its own, it asks every
// other rank where it is, and every rank's watchdog answers with its collective's sequence number
// and name, so the ranks that never answered are named by their absence (NCCL's flight recorder's
// question: which ranks never joined collective N), with one survivor too.

#include "parallel/communicator.h"

#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace ht {

// Before MPI_Finalize: no watchdog calls MPI once this returns (a communicator outliving the
// finalize, as main's grid does, would answer roll calls into a finalized MPI).
void stop_roll_calls();

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm`. `world_rank` names this process in error messages.
  MpiCommunicator(MPI_Comm comm, int world_rank);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  MPI_Comm comm() const { return comm_; }
  int world_rank() const { return world_rank_; }
  void allreduce_sum(at::Tensor& t, const char* what) override;
  void broadcast(at::Tensor& t, int root, const char* what) override;
  void barrier(const char* what) override;
  // MPI_Ibarrier, tested every millisecond with sleeps between: Open MPI's blocking calls spin.
  void idle_barrier(const char* what) override;
  // MPI_Reduce_scatter (float, double, int32, int64) and MPI_Allgatherv (any dtype, by element
  // size): uneven counts are MPI's own; at most 2^31 - 1 elements a rank.
  void reduce_scatter_sum(const at::Tensor& full, at::Tensor& shard, const std::vector<int64_t>& counts,
                          const char* what) override;
  void all_gather(const at::Tensor& shard, at::Tensor& full, const std::vector<int64_t>& counts,
                  const char* what) override;
  void send(const at::Tensor& t, int to, const char* what) override;
  void recv(at::Tensor& t, int from, const char* what) override;
  // Any dtype: the bytes of a contiguous tensor cross as they are.
  std::unique_ptr<Transfer> isend(const at::Tensor& t, int to, int tag, const std::string& what) override;
  std::unique_ptr<Transfer> irecv(at::Tensor& t, int from, int tag, const std::string& what) override;
  std::string backend() const override { return "mpi"; }
  // MPI was initialized with MPI_THREAD_SERIALIZED or more.
  bool allows_worker_thread() const override;

 private:
  void check(int rc, const char* collective, const char* what) const;
  // Marks the collective the watchdog times (until the returned guard ends).
  class Watched;
  class MpiTransfer;
  void watchdog();
  // Where this rank is: its world rank, the collectives begun, the one it waits in (if any).
  struct Whereabouts {
    int32_t world_rank = 0, waiting = 0;
    int64_t sequence = 0;
    char collective[112] = {};
  };
  Whereabouts whereabouts();
  void answer_roll_calls();                       // the watchdog's: every 100 ms
  void answer_pending_calls();                    // answer_roll_calls' work, g_roll_calls held
  std::string call_the_roll(double deadline_s);  // the watchdog's, on a timeout: who did not answer

  MPI_Comm comm_;
  MPI_Comm roll_ = MPI_COMM_NULL;  // the roll call's own (MPI_COMM_NULL: no MPI_THREAD_MULTIPLE)
  std::vector<int> world_of_;      // comm rank -> world rank
  int64_t sequence_ = 0;           // collectives begun on this communicator
  int rank_ = 0, size_ = 1, world_rank_ = 0;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::string current_;  // "the all-reduce of the gradients", empty outside collectives
  std::string current_context_;
  double current_timeout_ = 0;
  std::chrono::steady_clock::time_point since_;
  std::thread watchdog_;
};

}  // namespace ht

#pragma once
// Communicator over NCCL, for data parallelism on GPUs (training.device = "cuda" under mpirun).
//
// - Bootstrap: rank 0 of `bootstrap` (the MPI group of the same ranks) makes NCCL's unique id and
//   broadcasts it as 128 bytes over that group; no other MPI call is made after.
// - The device: cudaSetDevice(device) before anything touches the GPU (the launcher passes the
//   rank's local rank modulo the GPUs it sees).
// - Order: collectives run on the stream ATen computes on (its current stream, where libtorch has
//   CUDA; the legacy default stream otherwise), so they follow the kernels that produced their
//   input and precede those that read the result, with no host synchronization for that; or, with
//   a communication stream (the replicas' group), on that stream behind an event of the caller's,
//   beside the kernels queued after them.
// - A call on device tensors returns once it is queued: the caller's stream waits for it on an
//   event where it runs on another (so what the caller queues next reads its result), the host does
//   not. A watchdog thread (parallel/watchdog.h) watches each call's event and NCCL's asynchronous
//   error; past the timeout, or on an error, it aborts the communicator, and the next call throws
//   an error naming the rank, the context and the collective (another rank died or hangs).
// - Host tensors (the per-parameter "had a gradient" flags, a loss) cross through a device buffer
//   of this communicator's, and the host waits for them (and a barrier), polling NCCL's state.
// - The replicas' group hands its communication stream to StreamCollectives
//   (parallel/stream_collectives.h, side_stream()): their jobs are queued on it from the computing
//   thread, and the compute stream waits for them on events.
// - Point to point (pipeline stages): NCCL matches a link's messages in posting order, not by tag,
//   and holds the stream until a call meets its match; so matches_by_tag() is false, and a stage
//   posts its sends and receives in groups (post_group: ncclGroupStart/End) by a plan checked to
//   run on serial streams (parallel/pipeline_links.h). A group holds the caller's stream, not the
//   host.
//
// Built where the CUDA toolkit and NCCL are found (parallel/CMakeLists.txt: HT_HAVE_NCCL). Not yet
// run on a GPU: docs/status.md.

#include "parallel/communicator.h"

#include <memory>
#include <mutex>
#include <string>
#include <vector>

struct CUstream_st;  // cudaStream_t's, kept out of this header

namespace ht {

class NcclCommunicator final : public Communicator {
 public:
  // `bootstrap`: a group of the same ranks in the same order (MPI). `device`: the CUDA device
  // index this rank uses. `world_rank` names this process in error messages.
  // `side_stream`: collectives run on a communication stream of its own, behind an event of the
  // caller's stream, so they overlap the kernels queued after them (the replicas' all-reduces,
  // reduce-scatters and prefetched gathers, queued by StreamCollectives); else on the caller's
  // stream (a tensor-parallel group's, inside every layer).
  NcclCommunicator(Communicator& bootstrap, int device, int world_rank, bool side_stream = false);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void allreduce_sum(at::Tensor& t, const char* what) override;
  void broadcast(at::Tensor& t, int root, const char* what) override;
  void barrier(const char* what) override;
  // ncclReduceScatter and ncclAllGather on CUDA tensors. NCCL's counts are equal: uneven ones go
  // through zero-padded copies (rank r's part at r x the largest count), one whole's worth of
  // temporary device memory.
  void reduce_scatter_sum(const at::Tensor& full, at::Tensor& shard, const std::vector<int64_t>& counts,
                          const char* what) override;
  void all_gather(const at::Tensor& shard, at::Tensor& full, const std::vector<int64_t>& counts,
                  const char* what) override;
  void send(const at::Tensor& t, int to, const char* what) override;
  void recv(at::Tensor& t, int from, const char* what) override;
  std::unique_ptr<Transfer> isend(const at::Tensor& t, int to, int tag, const std::string& what) override;
  std::unique_ptr<Transfer> irecv(at::Tensor& t, int from, int tag, const std::string& what) override;
  std::unique_ptr<Transfer> post_group(std::vector<PeerMessage> messages) override;
  bool matches_by_tag() const override { return false; }
  std::string backend() const override { return "nccl"; }
  // One call at a time from any thread: cudaSetDevice is per thread, and every call sets it.
  bool allows_worker_thread() const override { return true; }
  // The communication stream (side_stream at construction, where libtorch has CUDA), else null.
  std::shared_ptr<SideStream> side_stream() const override;
  void rethrow_async_failure() override;
  void set_timeout(double seconds) override;

 private:
  struct State;  // NCCL's and CUDA's handles, kept out of this header
  enum class Op { kAllReduce, kBroadcast, kSend, kRecv };
  void run(Op op, at::Tensor& t, int peer, const char* collective, const char* what);
  // The stream a collective is enqueued on (a cudaStream_t).
  ::CUstream_st* enqueue_stream(const char* collective, const char* what);
  void settle(const char* collective, const char* what);
  void begin(const char* collective, const char* what);
  std::unique_lock<std::recursive_mutex> locked(const char* collective, const char* what);
  void stage(size_t bytes, const char* collective, const char* what);
  void hand_over(::CUstream_st* stream, const std::string& collective, const char* what);
  std::string describe(const std::string& collective, const char* what) const;
  void wait(const char* collective, const char* what);
  // After a collective was enqueued: settles it (NCCL has queued it on the stream).
  void complete(int enqueued, const char* collective, const char* what);  // an ncclResult_t
  void prepare_shards(const at::Tensor& full, const at::Tensor& shard, const std::vector<int64_t>& counts,
                     const char* collective, const char* what);
  [[noreturn]] void fail(const std::string& collective, const char* what, const std::string& why);

  std::unique_ptr<State> state_;
  int rank_ = 0, size_ = 1, device_ = 0, world_rank_ = 0;
};

// The CUDA devices this process sees (0 where none, or no driver).
int visible_cuda_devices();

}  // namespace ht

#pragma once
// Collectives on at::Tensors between the ranks of one group. The trainer sees only this
// interface; MpiCommunicator (CPU tensors) implements it over MPI, LocalCommunicator is a group of
// one (a run without mpirun), where every collective is the identity. NcclCommunicator
// (nccl_communicator.h) carries CUDA tensors, in builds with NCCL.

#include <ATen/core/Tensor.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace ht {

class SideStream;  // parallel/stream_collectives.h

// A collective failed or timed out; the message names the rank, the context and the collective.
class CommunicationError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A point-to-point message under way (Communicator::isend / irecv). Its tensor stays alive and
// untouched until wait() returns; the destructor of one never waited for waits for it.
class Transfer {
 public:
  virtual ~Transfer() = default;
  // Until the message has gone (send) or arrived (receive), bounded by the timeout; throws
  // CommunicationError naming the rank, the context and what was exchanged.
  virtual void wait() = 0;
  // Whether it has completed (never blocks; a sender reaps the sends it no longer needs to hold).
  virtual bool done() = 0;
};

// A transfer that completed before it was returned (a backend whose calls block).
class CompletedTransfer final : public Transfer {
 public:
  void wait() override {}
  bool done() override { return true; }
};

// One send or receive of a group (Communicator::post_group).
struct PeerMessage {
  bool send = false;
  at::Tensor tensor;  // contiguous; a receive fills it, so its shape and dtype are the sender's
  int peer = 0;
  int tag = 0;        // the message's identity: by it MPI matches, and an in-order backend checks
  std::string what;   // "the activation for virtual stage 2 of micro-batch 5", for error messages
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place; `t` must be contiguous. What the collective is for goes into error messages.
  virtual void allreduce_sum(at::Tensor& t, const char* what) = 0;
  virtual void broadcast(at::Tensor& t, int root, const char* what) = 0;
  virtual void barrier(const char* what) = 0;
  // A barrier whose waiting ranks sleep rather than poll: while one rank works alone (rank 0
  // profiling the model for the planner), the others leave it the cores. A backend without
  // such a wait gives a plain barrier.
  virtual void idle_barrier(const char* what) { barrier(what); }
  // Reduce-scatter: the sum over the group of every rank's `full` (contiguous, sum(counts)
  // elements); this rank receives its part, elements [offset, offset + counts[rank]) where offset
  // is the sum of the counts before its own, into `shard` (contiguous, counts[rank] elements,
  // apart from `full`). Counts may differ between ranks (uneven shards); a backend whose
  // collective needs equal ones pads internally, never changing a result.
  virtual void reduce_scatter_sum(const at::Tensor& full, at::Tensor& shard, const std::vector<int64_t>& counts,
                                  const char* what) = 0;
  // All-gather: every rank's `shard` (counts[rank] elements) into `full` (sum(counts) elements)
  // at that rank's offset, on every rank. `shard` may be `full`'s own slice at this rank's offset
  // (in place, no copy of it); any dtype: the bytes cross as they are.
  virtual void all_gather(const at::Tensor& shard, at::Tensor& full, const std::vector<int64_t>& counts,
                          const char* what) = 0;
  // Point to point (pipeline stages): `t` contiguous; recv fills it, so its shape and dtype must
  // be the sender's.
  virtual void send(const at::Tensor& t, int to, const char* what) = 0;
  virtual void recv(at::Tensor& t, int from, const char* what) = 0;
  // Nonblocking point to point (pipeline stages): messages between two ranks match by `tag`, so
  // each side may post them in its own order. `what` ("the activation of micro-batch 3") goes
  // into error messages, with the context current when the transfer was posted.
  virtual std::unique_ptr<Transfer> isend(const at::Tensor& t, int to, int tag, const std::string& what) = 0;
  virtual std::unique_ptr<Transfer> irecv(at::Tensor& t, int from, int tag, const std::string& what) = 0;
  // Posts the messages together, as one NCCL group: they progress independently of each other,
  // so two ranks that each send to and receive from the other in one group cannot block each
  // other. One transfer for the group; its wait covers every message (it may be waited twice).
  // The default posts each by isend or irecv.
  virtual std::unique_ptr<Transfer> post_group(std::vector<PeerMessage> messages);
  // Whether a link's messages match by tag (MPI: each side posts in its own order, and a posted
  // call waits aside), or in the order they are posted, each call holding the rank's stream until
  // its peer posts the match (NCCL): a pipeline stage then posts by a plan checked to run so
  // (parallel/pipeline_links.h).
  virtual bool matches_by_tag() const { return true; }
  virtual std::string backend() const = 0;
  // Whether a thread other than the one that made it may call it (one call at a time): what
  // overlapping all-reduce with backward needs (parallel/collective_worker.h).
  virtual bool allows_worker_thread() const = 0;
  // A stream of this communicator's own for collectives the compute stream waits for on events
  // (NCCL's replicas on a GPU: parallel/stream_collectives.h); null (the default) where none.
  virtual std::shared_ptr<SideStream> side_stream() const { return nullptr; }
  // Throws the failure of a call the host did not wait for (a watchdog's: parallel/watchdog.h),
  // if there was one; nothing where every call is waited for.
  virtual void rethrow_async_failure() {}
  // A collective that has not completed after this long ends with an error naming this rank,
  // the context and the collective: another rank has died or hangs.
  virtual void set_timeout(double seconds) { timeout_s_ = seconds; }
  double timeout() const { return timeout_s_; }
  // Where the job is ("step 12"), for error messages.
  void set_context(std::string context) { context_ = std::move(context); }
  const std::string& context() const { return context_; }

 protected:
  // A send or receive as a group of one: isend and irecv of a backend whose calls are groups.
  std::unique_ptr<Transfer> post_one(bool send, const at::Tensor& t, int peer, int tag, const std::string& what) {
    std::vector<PeerMessage> one;
    one.push_back({send, t, peer, tag, what});
    return post_group(std::move(one));
  }

 private:
  double timeout_s_ = 300;
  std::string context_ = "start";
};

// Checks the arguments of a reduce-scatter or all-gather against the group (`counts` one per rank,
// non-negative; `full` and `shard` contiguous, of one dtype and of sum(counts) and counts[rank]
// elements) and returns this rank's offset into `full`; throws CommunicationError naming `what`.
int64_t check_shard_arguments(const Communicator& group, const at::Tensor& full, const at::Tensor& shard,
                              const std::vector<int64_t>& counts, const char* collective, const char* what);

class LocalCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void allreduce_sum(at::Tensor&, const char*) override {}
  void broadcast(at::Tensor&, int, const char*) override {}
  void barrier(const char*) override {}
  // A group of one: the shard is the whole (a copy where they are two tensors).
  void reduce_scatter_sum(const at::Tensor& full, at::Tensor& shard, const std::vector<int64_t>& counts,
                          const char* what) override;
  void all_gather(const at::Tensor& shard, at::Tensor& full, const std::vector<int64_t>& counts,
                  const char* what) override;
  void send(const at::Tensor&, int to, const char* what) override { no_peer(to, what); }
  void recv(at::Tensor&, int from, const char* what) override { no_peer(from, what); }
  std::unique_ptr<Transfer> isend(const at::Tensor&, int to, int, const std::string& what) override {
    no_peer(to, what.c_str());
    return nullptr;
  }
  std::unique_ptr<Transfer> irecv(at::Tensor&, int from, int, const std::string& what) override {
    no_peer(from, what.c_str());
    return nullptr;
  }
  std::string backend() const override { return "local"; }
  bool allows_worker_thread() const override { return true; }

 private:
  static void no_peer(int peer, const char* what) {
    throw CommunicationError(std::string("a group without peers has no rank ") + std::to_string(peer) +
                             " to exchange " + what + " with");
  }
};

// A group of `size` ranks whose other ranks are this one's mirror: every collective returns what
// this rank would receive if each rank held its data. The planner profiles one rank of a
// tensor-parallel group with it (launcher/planning/profiler.cpp): the rank's part of the model,
// its shapes, its memory and its kernels, without the others; the exchanges' time is modelled.
class MirrorCommunicator final : public LocalCommunicator {
 public:
  explicit MirrorCommunicator(int size) : size_(size) {}
  int size() const override { return size_; }
  // All-reduce, broadcast, barrier: the values of one rank, unchanged (no growth); no peer to send to.
  void reduce_scatter_sum(const at::Tensor& full, at::Tensor& shard, const std::vector<int64_t>& counts,
                          const char* what) override;
  void all_gather(const at::Tensor& shard, at::Tensor& full, const std::vector<int64_t>& counts,
                  const char* what) override;
  // A group's receives get its sends' tensors, in order (a ring's pass: what comes from the
  // previous rank is what this rank sends the next).
  std::unique_ptr<Transfer> post_group(std::vector<PeerMessage> messages) override;
  std::string backend() const override { return "mirror"; }

 private:
  int size_;
};

}  // namespace ht

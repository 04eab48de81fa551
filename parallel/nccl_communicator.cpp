#include "parallel/nccl_communicator.h"

#include <ATen/ATen.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "parallel/cuda_side_stream.h"
#include "parallel/watchdog.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

namespace ht {
namespace {

ncclDataType_t nccl_type(const at::Tensor& t, const char* what) {
  switch (t.scalar_type()) {
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    case at::kByte: return ncclUint8;
    case at::kChar: return ncclInt8;
    default:
      throw CommunicationError(std::string("NCCL cannot carry ") + what + ": its dtype " +
                               std::string(c10::toString(t.scalar_type())) + " has no NCCL type");
  }
}

cudaStream_t compute_stream(int device) { return current_cuda_stream(device); }

// The largest of the ranks' counts, and whether every rank has it (NCCL's own case, unpadded).
std::pair<int64_t, bool> largest_count(const std::vector<int64_t>& counts) {
  const int64_t most = *std::max_element(counts.begin(), counts.end());
  return {most, std::all_of(counts.begin(), counts.end(), [&](int64_t c) { return c == most; })};
}

}  // namespace

struct NcclCommunicator::State {
  ncclComm_t comm = nullptr;
  // Held while NCCL's calls are made on `comm`, and by abort(): never across anything that may
  // wait for the GPU, so the watchdog can always abort.
  std::recursive_mutex comm_mutex;
  std::atomic<bool> aborted{false};
  cudaEvent_t done = nullptr;     // after a call the host waits for
  cudaStream_t side = nullptr;    // the communication stream (side_stream), else none
  cudaEvent_t ready = nullptr;    // recorded on the caller's stream: what a collective on `side` waits for
  std::shared_ptr<SideStream> side_stream;  // over `side`, where libtorch has CUDA
  void* staging = nullptr;  // device buffer for host tensors
  void* pinned = nullptr;   // and its pinned host side: the copies do not block the host
  size_t staging_bytes = 0;
  std::mutex events_mutex;
  std::vector<cudaEvent_t> spare_events;  // passed: for the next call
  std::unique_ptr<Watchdog> watchdog;     // the calls the host does not wait for

  cudaEvent_t take_event() {
    {
      std::lock_guard<std::mutex> lock(events_mutex);
      if (!spare_events.empty()) {
        cudaEvent_t e = spare_events.back();
        spare_events.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    return cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess ? e : nullptr;
  }
  void give_back(cudaEvent_t e) {
    std::lock_guard<std::mutex> lock(events_mutex);
    spare_events.push_back(e);
  }
  // Ends NCCL's work in flight, once (its kernels return, so the streams waiting on them go on):
  // the watchdog's, or a host wait's, past the timeout.
  void abort() {
    std::lock_guard<std::recursive_mutex> lock(comm_mutex);
    if (aborted || comm == nullptr) return;
    aborted = true;
    ncclCommAbort(comm);
  }
  // NCCL's asynchronous error in words, "" while none (or while a call is being made: asked again
  // at the next poll, so the watchdog never waits behind a call).
  std::string async_error() {
    std::unique_lock<std::recursive_mutex> lock(comm_mutex, std::try_to_lock);
    if (!lock.owns_lock() || aborted || comm == nullptr) return "";
    ncclResult_t rc = ncclSuccess;
    ncclCommGetAsyncError(comm, &rc);
    return rc == ncclSuccess || rc == ncclInProgress ? std::string() : std::string(ncclGetErrorString(rc));
  }
};

int visible_cuda_devices() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

NcclCommunicator::NcclCommunicator(Communicator& bootstrap, int device, int world_rank, bool side_stream)
    : state_(std::make_unique<State>()), rank_(bootstrap.rank()), size_(bootstrap.size()), device_(device),
      world_rank_(world_rank) {
  Communicator::set_timeout(bootstrap.timeout());
  set_context(bootstrap.context());
  if (cudaSetDevice(device_) != cudaSuccess) {
    fail("setting up NCCL", "the device", "cudaSetDevice(" + std::to_string(device_) + ") failed: " +
                                              cudaGetErrorString(cudaGetLastError()) + " (" +
                                              std::to_string(visible_cuda_devices()) + " devices visible)");
  }
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (rank_ == 0) {
    const ncclResult_t rc = ncclGetUniqueId(&id);
    if (rc != ncclSuccess) fail("setting up NCCL", "its unique id", ncclGetErrorString(rc));
  }
  at::Tensor bytes = at::empty({static_cast<int64_t>(sizeof(id))}, at::kByte);
  std::memcpy(bytes.data_ptr(), &id, sizeof(id));
  bootstrap.broadcast(bytes, 0, "NCCL's unique id");
  std::memcpy(&id, bytes.data_ptr(), sizeof(id));
  // Nonblocking, so that a rank that never joins shows as a timeout here, not a hang.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const ncclResult_t rc = ncclCommInitRankConfig(&state_->comm, size_, id, rank_, &config);
  if (rc != ncclSuccess && rc != ncclInProgress) fail("setting up NCCL", "the communicator", ncclGetErrorString(rc));
  settle("setting up NCCL", "the communicator");
  if (cudaEventCreateWithFlags(&state_->done, cudaEventDisableTiming) != cudaSuccess) {
    fail("setting up NCCL", "its completion event", cudaGetErrorString(cudaGetLastError()));
  }
  if (side_stream && (cudaStreamCreateWithFlags(&state_->side, cudaStreamNonBlocking) != cudaSuccess ||
                      cudaEventCreateWithFlags(&state_->ready, cudaEventDisableTiming) != cudaSuccess)) {
    fail("setting up NCCL", "its communication stream", cudaGetErrorString(cudaGetLastError()));
  }
  // Null without libtorch's CUDA: the replicas' jobs then run on a worker thread.
  if (state_->side != nullptr) state_->side_stream = make_cuda_side_stream(device_, state_->side, state_->ready);
  State* state = state_.get();
  const int device_index = device_;
  state_->watchdog = std::make_unique<Watchdog>(
      timeout(),
      Watchdog::Backend{[state] { return state->async_error(); }, [state] { state->abort(); },
                        [device_index] { cudaSetDevice(device_index); }},
      /*grace_s=*/timeout());
}

void NcclCommunicator::set_timeout(double seconds) {
  Communicator::set_timeout(seconds);
  if (state_ && state_->watchdog) state_->watchdog->set_timeout(seconds);
}

std::shared_ptr<SideStream> NcclCommunicator::side_stream() const { return state_->side_stream; }

void NcclCommunicator::rethrow_async_failure() { state_->watchdog->rethrow(); }

// Where a collective runs: the communication stream, behind what the caller's stream has queued
// (the kernels that made its input), or the caller's stream itself (a job of StreamCollectives,
// whose current stream is the communication stream, is behind the compute stream already).
cudaStream_t NcclCommunicator::enqueue_stream(const char* collective, const char* what) {
  const cudaStream_t current = compute_stream(device_);
  if (state_->side == nullptr || current == state_->side) return current;
  if (cudaEventRecord(state_->ready, current) != cudaSuccess ||
      cudaStreamWaitEvent(state_->side, state_->ready, 0) != cudaSuccess) {
    fail(collective, what, cudaGetErrorString(cudaGetLastError()));
  }
  return state_->side;
}

// Calls may still be queued (the host does not wait for them): they are given the timeout to end
// while the watchdog still watches; what has not ended, or failed, is aborted rather than
// destroyed (ncclCommDestroy would wait for it, and for a peer that is gone). While an exception
// unwinds (this rank is failing) nothing is waited for: peers may never match what is queued.
NcclCommunicator::~NcclCommunicator() {
  if (!state_) return;
  cudaSetDevice(device_);
  const double patience = std::uncaught_exceptions() > 0 ? 0.0 : timeout();
  if (state_->watchdog && !state_->watchdog->wait_all_for(patience)) state_->abort();
  state_->watchdog.reset();  // its thread touches the communicator and the events
  if (state_->comm != nullptr && !state_->aborted) ncclCommDestroy(state_->comm);
  if (state_->done != nullptr) cudaEventDestroy(state_->done);
  if (state_->ready != nullptr) cudaEventDestroy(state_->ready);
  if (state_->side != nullptr) cudaStreamDestroy(state_->side);
  if (state_->staging != nullptr) cudaFree(state_->staging);
  if (state_->pinned != nullptr) cudaFreeHost(state_->pinned);
  for (cudaEvent_t e : state_->spare_events) cudaEventDestroy(e);
}

std::string NcclCommunicator::describe(const std::string& collective, const char* what) const {
  return "rank " + std::to_string(world_rank_) + ", " + context() + ": " + collective + " of " + what +
         " (NCCL, cuda:" + std::to_string(device_) + ")";
}

void NcclCommunicator::fail(const std::string& collective, const char* what, const std::string& why) {
  throw CommunicationError(describe(collective, what) + " failed: " + why);
}

// Before a call: the failure of an earlier one the host did not wait for, if any.
void NcclCommunicator::begin(const char* collective, const char* what) {
  state_->watchdog->rethrow();
  if (state_->aborted) fail(collective, what, "the communicator was aborted after an earlier failure");
  cudaSetDevice(device_);
}

// The lock NCCL's calls are made under, taken after begin(): the watchdog may have aborted the
// communicator in between, and a call on an aborted one would use freed state.
std::unique_lock<std::recursive_mutex> NcclCommunicator::locked(const char* collective, const char* what) {
  std::unique_lock<std::recursive_mutex> lock(state_->comm_mutex);
  if (state_->aborted) {
    lock.unlock();
    state_->watchdog->rethrow();
    fail(collective, what, "the communicator was aborted after an earlier failure");
  }
  return lock;
}

// The device buffer host tensors cross through, and its pinned host side, for `bytes`. Made
// before the lock: freeing the old ones waits for the GPU.
void NcclCommunicator::stage(size_t bytes, const char* collective, const char* what) {
  if (bytes <= state_->staging_bytes) return;
  if (state_->staging != nullptr) cudaFree(state_->staging);
  if (state_->pinned != nullptr) cudaFreeHost(state_->pinned);
  state_->staging = state_->pinned = nullptr;
  state_->staging_bytes = 0;
  if (cudaMalloc(&state_->staging, bytes) != cudaSuccess || cudaMallocHost(&state_->pinned, bytes) != cudaSuccess) {
    cudaGetLastError();
    fail(collective, what, "no memory for the " + std::to_string(bytes) + " bytes of a host tensor's device copy");
  }
  state_->staging_bytes = bytes;
}

// After a call on device tensors was queued on `stream`: an event behind it for the watchdog, and
// the caller's stream waits for it where the call ran on another, so what the caller queues next
// reads the result; the host goes on.
void NcclCommunicator::hand_over(cudaStream_t stream, const std::string& collective, const char* what) {
  cudaEvent_t event = state_->take_event();
  const cudaStream_t current = compute_stream(device_);
  if (event == nullptr || cudaEventRecord(event, stream) != cudaSuccess ||
      (stream != current && cudaStreamWaitEvent(current, event, 0) != cudaSuccess)) {
    const std::string why = cudaGetErrorString(cudaGetLastError());
    cudaStreamSynchronize(stream);  // neither watched nor waited for: its tensors may go once it is done
    if (event != nullptr) state_->give_back(event);
    fail(collective, what, "its completion event: " + why);
  }
  State* state = state_.get();
  state_->watchdog->watch(describe(collective, what), [state, event] {
    if (cudaEventQuery(event) == cudaErrorNotReady) return false;
    state->give_back(event);  // an error shows in NCCL's state, which the watchdog reads next
    return true;
  });
}

void NcclCommunicator::run(Op op, at::Tensor& t, int peer, const char* collective, const char* what) {
  if (!t.is_contiguous()) fail(collective, what, "the tensor is not contiguous");
  if (t.is_cuda() && t.get_device() != device_) {
    fail(collective, what, "the tensor is on cuda:" + std::to_string(t.get_device()) + ", this rank's NCCL on cuda:" +
                               std::to_string(device_));
  }
  begin(collective, what);
  // Point to point holds the caller's stream (a pipeline's order); collectives run on the
  // communication stream where there is one.
  const bool p2p = op == Op::kSend || op == Op::kRecv;
  const cudaStream_t stream = p2p ? compute_stream(device_) : enqueue_stream(collective, what);
  const ncclDataType_t type = nccl_type(t, what);
  const size_t bytes = t.nbytes(), count = static_cast<size_t>(t.numel());
  void* data = t.data_ptr();
  const bool host = !t.is_cuda();
  if (host) {  // through this communicator's device buffer, from and to its pinned host side
    stage(bytes, collective, what);
    if (op != Op::kRecv) {
      std::memcpy(state_->pinned, data, bytes);
      cudaMemcpyAsync(state_->staging, state_->pinned, bytes, cudaMemcpyHostToDevice, stream);
    }
    data = state_->staging;
  }
  {
    const std::unique_lock<std::recursive_mutex> lock = locked(collective, what);
    ncclResult_t rc = ncclSuccess;
    switch (op) {
      case Op::kAllReduce: rc = ncclAllReduce(data, data, count, type, ncclSum, state_->comm, stream); break;
      case Op::kBroadcast: rc = ncclBroadcast(data, data, count, type, peer, state_->comm, stream); break;
      case Op::kSend: rc = ncclSend(data, count, type, peer, state_->comm, stream); break;
      case Op::kRecv: rc = ncclRecv(data, count, type, peer, state_->comm, stream); break;
    }
    if (rc != ncclSuccess && rc != ncclInProgress) fail(collective, what, ncclGetErrorString(rc));
    settle(collective, what);  // enqueued on the stream before the event behind it is recorded
  }
  if (!host) {
    hand_over(stream, collective, what);
    return;
  }
  // A host tensor is read on the host next: the host waits (polling, so the timeout holds).
  if (op != Op::kSend) cudaMemcpyAsync(state_->pinned, state_->staging, bytes, cudaMemcpyDeviceToHost, stream);
  if (cudaEventRecord(state_->done, stream) != cudaSuccess) fail(collective, what, cudaGetErrorString(cudaGetLastError()));
  wait(collective, what);
  if (op != Op::kSend) std::memcpy(t.data_ptr(), state_->pinned, bytes);
}

// A nonblocking communicator returns from a call before the work is set up or enqueued
// (ncclInProgress): until its state says done, no other call may be made on it, bounded by the
// timeout (a rank that never joins the communicator shows here).
void NcclCommunicator::settle(const char* collective, const char* what) {
  const auto start = std::chrono::steady_clock::now();
  ncclResult_t rc = ncclInProgress;
  for (;;) {
    ncclCommGetAsyncError(state_->comm, &rc);
    if (rc != ncclInProgress) break;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout()) {
      state_->abort();
      fail(collective, what, "not under way after " + std::to_string(timeout()) +
                                 " s (parallel.timeout_s): another rank has died, hangs, or never joined");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  if (rc != ncclSuccess) fail(collective, what, ncclGetErrorString(rc));
}

// Until the event after a call the host waits for has passed (a host tensor's, a barrier's):
// NCCL's asynchronous errors and the timeout are checked meanwhile, and a call past its timeout
// aborts the communicator.
void NcclCommunicator::wait(const char* collective, const char* what) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    // An abort by the watchdog ends the kernels too: its failure, not a passed event, is the news.
    state_->watchdog->rethrow();
    const cudaError_t status = cudaEventQuery(state_->done);
    if (status == cudaSuccess) {
      state_->watchdog->rethrow();
      return;
    }
    if (status != cudaErrorNotReady) fail(collective, what, cudaGetErrorString(status));
    const std::string async = state_->async_error();
    if (!async.empty()) fail(collective, what, async);
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited > timeout()) {
      state_->abort();
      fail(collective, what, "not done after " + std::to_string(timeout()) +
                                 " s (parallel.timeout_s): another rank has died or hangs");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void NcclCommunicator::prepare_shards(const at::Tensor& full, const at::Tensor& shard, const std::vector<int64_t>& counts,
                                     const char* collective, const char* what) {
  check_shard_arguments(*this, full, shard, counts, collective, what);
  if (!full.is_cuda() || full.get_device() != device_) {
    fail(collective, what, "needs tensors on this rank's cuda:" + std::to_string(device_));
  }
  begin(collective, what);
}

void NcclCommunicator::complete(int enqueued, const char* collective, const char* what) {
  const auto rc = static_cast<ncclResult_t>(enqueued);
  if (rc != ncclSuccess && rc != ncclInProgress) fail(collective, what, ncclGetErrorString(rc));
  settle(collective, what);
}

void NcclCommunicator::reduce_scatter_sum(const at::Tensor& full, at::Tensor& shard,
                                          const std::vector<int64_t>& counts, const char* what) {
  const char* collective = "the reduce-scatter";
  prepare_shards(full, shard, counts, collective, what);
  const auto [most, even] = largest_count(counts);
  // Uneven counts copy through padded tensors by ATen's kernels, on the caller's stream.
  const cudaStream_t stream = even ? enqueue_stream(collective, what) : compute_stream(device_);
  at::Tensor send = full, recv = shard;
  if (!even) {  // rank r's part at r x most, zeros after it
    send = at::zeros({most * size_}, full.options());
    int64_t offset = 0;
    for (int r = 0; r < size_; ++r) {
      send.narrow(0, r * most, counts[r]).copy_(full.narrow(0, offset, counts[r]));
      offset += counts[r];
    }
    recv = at::empty({most}, full.options());
  }
  {
    const std::unique_lock<std::recursive_mutex> lock = locked(collective, what);
    complete(ncclReduceScatter(send.data_ptr(), recv.data_ptr(), static_cast<size_t>(most), nccl_type(full, what),
                               ncclSum, state_->comm, stream),
             collective, what);
  }
  if (!even) shard.copy_(recv.narrow(0, 0, shard.numel()));
  hand_over(stream, collective, what);
}

void NcclCommunicator::all_gather(const at::Tensor& shard, at::Tensor& full, const std::vector<int64_t>& counts,
                                  const char* what) {
  const char* collective = "the all-gather";
  prepare_shards(full, shard, counts, collective, what);
  const auto [most, even] = largest_count(counts);
  const cudaStream_t stream = even ? enqueue_stream(collective, what) : compute_stream(device_);
  at::Tensor send = shard, recv = full;
  if (!even) {
    send = at::zeros({most}, full.options());
    send.narrow(0, 0, shard.numel()).copy_(shard);
    recv = at::empty({most * size_}, full.options());
  }
  // Even and in place (the shard is the whole's own slice) is NCCL's in-place all-gather.
  {
    const std::unique_lock<std::recursive_mutex> lock = locked(collective, what);
    complete(ncclAllGather(send.data_ptr(), recv.data_ptr(), static_cast<size_t>(most), nccl_type(full, what),
                           state_->comm, stream),
             collective, what);
  }
  if (!even) {
    int64_t offset = 0;
    for (int r = 0; r < size_; ++r) {
      full.narrow(0, offset, counts[r]).copy_(recv.narrow(0, r * most, counts[r]));
      offset += counts[r];
    }
  }
  hand_over(stream, collective, what);
}

void NcclCommunicator::allreduce_sum(at::Tensor& t, const char* what) {
  run(Op::kAllReduce, t, 0, "the all-reduce", what);
}

void NcclCommunicator::broadcast(at::Tensor& t, int root, const char* what) {
  run(Op::kBroadcast, t, root, "the broadcast", what);
}

// A host tensor's all-reduce: the host waits for it, and so for every call queued before it on
// its stream.
void NcclCommunicator::barrier(const char* what) {
  at::Tensor one = at::ones({1}, at::kFloat);
  run(Op::kAllReduce, one, 0, "the barrier", what);
}

void NcclCommunicator::send(const at::Tensor& t, int to, const char* what) {
  at::Tensor view = t;
  run(Op::kSend, view, to, "the send", what);
}

void NcclCommunicator::recv(at::Tensor& t, int from, const char* what) {
  run(Op::kRecv, t, from, "the receive", what);
}

std::unique_ptr<Transfer> NcclCommunicator::isend(const at::Tensor& t, int to, int tag, const std::string& what) {
  if (!t.is_cuda()) {  // through this communicator's device buffer (a checkpoint's counts)
    send(t.contiguous(), to, what.c_str());
    return std::make_unique<CompletedTransfer>();
  }
  return post_one(true, t, to, tag, what);
}

std::unique_ptr<Transfer> NcclCommunicator::irecv(at::Tensor& t, int from, int tag, const std::string& what) {
  if (!t.is_cuda()) {
    recv(t, from, what.c_str());
    return std::make_unique<CompletedTransfer>();
  }
  return post_one(false, t, from, tag, what);
}

// ncclGroupStart, each call's ncclSend or ncclRecv, ncclGroupEnd, on ATen's stream: the calls of
// the group progress together, and the group holds the stream until every one has met its match.
// The host goes on: what the stage queues next follows the group on the stream, and the
// watchdog keeps its timeout. So the transfer returned is complete as far as the caller's stream
// is concerned.
std::unique_ptr<Transfer> NcclCommunicator::post_group(std::vector<PeerMessage> messages) {
  std::string what;
  for (const PeerMessage& m : messages) {
    what += (what.empty() ? "" : ", ") + std::string(m.send ? "sending " : "receiving ") + m.what;
    if (!m.tensor.is_cuda() || m.tensor.get_device() != device_ || !m.tensor.is_contiguous()) {
      fail("a group of sends and receives", what.c_str(),
           "needs contiguous tensors on this rank's cuda:" + std::to_string(device_));
    }
  }
  const char* collective = "a group of sends and receives";
  begin(collective, what.c_str());
  const cudaStream_t stream = compute_stream(device_);
  {
    const std::unique_lock<std::recursive_mutex> lock = locked(collective, what.c_str());
    ncclResult_t rc = ncclGroupStart();
    for (size_t i = 0; rc == ncclSuccess && i < messages.size(); ++i) {
      const PeerMessage& m = messages[i];
      // As bytes: any dtype crosses as it is.
      const size_t bytes = m.tensor.nbytes();
      rc = m.send ? ncclSend(m.tensor.data_ptr(), bytes, ncclUint8, m.peer, state_->comm, stream)
                  : ncclRecv(m.tensor.data_ptr(), bytes, ncclUint8, m.peer, state_->comm, stream);
    }
    const ncclResult_t end = ncclGroupEnd();
    if (rc != ncclSuccess && rc != ncclInProgress) fail(collective, what.c_str(), ncclGetErrorString(rc));
    complete(end, collective, what.c_str());
  }
  hand_over(stream, collective, what.c_str());
  return std::make_unique<CompletedTransfer>();
}

}  // namespace ht

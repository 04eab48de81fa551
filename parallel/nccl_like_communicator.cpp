#include "parallel/nccl_like_communicator.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <mutex>
#include <thread>

namespace ht {
namespace {

// Every directed link is two channels, each matched in posting order: the messages' identities
// and their bytes.
constexpr int kIdentityTag = 1, kPayloadTag = 2;

struct Identity {
  int64_t tag = 0;
  int64_t bytes = 0;
  char what[112] = {};
};

Identity identity_of(const PeerMessage& m) {
  Identity id;
  id.tag = m.tag;
  id.bytes = static_cast<int64_t>(m.tensor.nbytes());
  std::strncpy(id.what, m.what.c_str(), sizeof(id.what) - 1);
  return id;
}

std::string call_words(const PeerMessage& m) {
  return (m.send ? "sends " : "receives ") + m.what + (m.send ? " to stage " : " from stage ") + std::to_string(m.peer);
}


// One call of a group: its identity's request, and its payload's once posted.
struct Call {
  const PeerMessage* message = nullptr;
  Identity identity;
  MPI_Request identity_request = MPI_REQUEST_NULL, payload_request = MPI_REQUEST_NULL;
  bool payload_posted = false;
  bool complete() const {
    return payload_posted && identity_request == MPI_REQUEST_NULL && payload_request == MPI_REQUEST_NULL;
  }
};

}  // namespace

NcclLikeCommunicator::NcclLikeCommunicator(std::shared_ptr<MpiCommunicator> inner) : inner_(std::move(inner)) {
  Communicator::set_timeout(inner_->timeout());
  set_context(inner_->context());
  MPI_Comm_dup(inner_->comm(), &links_);  // collective: every rank of the group makes its groups alike
  MPI_Comm_set_errhandler(links_, MPI_ERRORS_RETURN);
}

NcclLikeCommunicator::~NcclLikeCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && links_ != MPI_COMM_NULL) MPI_Comm_free(&links_);
}

void NcclLikeCommunicator::set_timeout(double seconds) {
  Communicator::set_timeout(seconds);
  inner_->set_timeout(seconds);
}

Communicator& NcclLikeCommunicator::synced() {
  inner_->set_context(context());
  return *inner_;
}

void NcclLikeCommunicator::fail(const std::string& why) const {
  throw CommunicationError("rank " + std::to_string(inner_->world_rank()) + " (stage " + std::to_string(rank()) +
                           "), " + context() + ", NCCL-like links: " + why);
}

void NcclLikeCommunicator::allreduce_sum(at::Tensor& t, const char* what) { synced().allreduce_sum(t, what); }
void NcclLikeCommunicator::broadcast(at::Tensor& t, int root, const char* what) { synced().broadcast(t, root, what); }
void NcclLikeCommunicator::barrier(const char* what) { synced().barrier(what); }
void NcclLikeCommunicator::idle_barrier(const char* what) { synced().idle_barrier(what); }
void NcclLikeCommunicator::reduce_scatter_sum(const at::Tensor& full, at::Tensor& shard,
                                              const std::vector<int64_t>& counts, const char* what) {
  synced().reduce_scatter_sum(full, shard, counts, what);
}
void NcclLikeCommunicator::all_gather(const at::Tensor& shard, at::Tensor& full, const std::vector<int64_t>& counts,
                                      const char* what) {
  synced().all_gather(shard, full, counts, what);
}

void NcclLikeCommunicator::send(const at::Tensor& t, int to, const char* what) { isend(t, to, 0, what)->wait(); }
void NcclLikeCommunicator::recv(at::Tensor& t, int from, const char* what) { irecv(t, from, 0, what)->wait(); }

std::unique_ptr<Transfer> NcclLikeCommunicator::isend(const at::Tensor& t, int to, int tag, const std::string& what) {
  return post_one(true, t, to, tag, what);
}

std::unique_ptr<Transfer> NcclLikeCommunicator::irecv(at::Tensor& t, int from, int tag, const std::string& what) {
  return post_one(false, t, from, tag, what);
}

std::unique_ptr<Transfer> NcclLikeCommunicator::post_group(std::vector<PeerMessage> messages) {
  // A device tensor crosses through host memory (several ranks sharing a GPU): a send's host copy
  // is made now, a receive's lands on the device once the group is done.
  std::vector<std::pair<at::Tensor, at::Tensor>> landing;  // (device, host)
  for (PeerMessage& m : messages) {
    if (m.tensor.is_cpu()) continue;
    if (m.send) {
      m.tensor = m.tensor.contiguous().cpu();
    } else {
      at::Tensor host = at::empty(m.tensor.sizes(), m.tensor.options().device(at::kCPU));
      landing.emplace_back(m.tensor, host);
      m.tensor = host;
    }
  }
  std::vector<Call> calls(messages.size());  // sized once: MPI holds the identities' addresses
  // A group given up cancels its calls. One MPI cannot cancel (a send already matched, or Open
  // MPI's sends) keeps its buffers for the rest of the process, so that nothing MPI still writes
  // or reads is freed under it; the job ends with the error anyway.
  const auto give_up = [&](const std::string& why) {
    for (Call& c : calls) {
      for (MPI_Request* r : {&c.identity_request, &c.payload_request}) {
        if (*r != MPI_REQUEST_NULL) MPI_Cancel(r);
      }
    }
    bool active = false;
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
    do {
      active = false;
      for (Call& c : calls) {
        for (MPI_Request* r : {&c.identity_request, &c.payload_request}) {
          int flag = 0;
          if (*r != MPI_REQUEST_NULL && MPI_Test(r, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && !flag) active = true;
        }
      }
    } while (active && std::chrono::steady_clock::now() < until);
    if (active) {
      static std::mutex kept_mutex;
      static std::vector<std::shared_ptr<void>> kept;  // never freed: MPI may still use them
      auto abandoned = std::make_shared<std::pair<std::vector<Call>, std::vector<PeerMessage>>>(std::move(calls),
                                                                                                 std::move(messages));
      std::lock_guard<std::mutex> lock(kept_mutex);
      kept.push_back(std::move(abandoned));
    }
    fail(why);
  };
  const auto check = [&](int rc, const PeerMessage& m) {
    if (rc == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING] = {};
    int length = 0;
    MPI_Error_string(rc, text, &length);
    give_up("the call that " + call_words(m) + " failed: " + text);
  };
  for (size_t i = 0; i < messages.size(); ++i) {
    const PeerMessage& m = messages[i];
    Call& c = calls[i];
    c.message = &m;
    if (!m.tensor.is_contiguous()) give_up("the call that " + call_words(m) + " needs a contiguous tensor");
    if (m.tensor.nbytes() > static_cast<size_t>(std::numeric_limits<int>::max())) {
      give_up("the call that " + call_words(m) + " carries more than 2^31 - 1 bytes");
    }
    const int bytes = static_cast<int>(m.tensor.nbytes());
    if (m.send) {
      c.identity = identity_of(m);
      check(MPI_Issend(&c.identity, sizeof(Identity), MPI_BYTE, m.peer, kIdentityTag, links_, &c.identity_request), m);
      check(MPI_Issend(m.tensor.data_ptr(), bytes, MPI_BYTE, m.peer, kPayloadTag, links_, &c.payload_request), m);
      c.payload_posted = true;
    } else {
      check(MPI_Irecv(&c.identity, sizeof(Identity), MPI_BYTE, m.peer, kIdentityTag, links_, &c.identity_request), m);
    }
  }
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    bool moved = false, complete = true;
    // A receive's payload is posted only after every earlier receive from the same stage has
    // posted its own: payloads match in posting order too, and two identities can arrive in one
    // pass in either order of this loop's tests.
    std::vector<int> behind;  // stages with an earlier receive whose payload is not posted yet
    for (Call& c : calls) {
      const PeerMessage& m = *c.message;
      int flag = 0;
      if (c.identity_request != MPI_REQUEST_NULL) {
        check(MPI_Test(&c.identity_request, &flag, MPI_STATUS_IGNORE), m);
        moved = moved || flag;
      }
      const bool waits_behind = std::find(behind.begin(), behind.end(), m.peer) != behind.end();
      if (!m.send && !c.payload_posted) {
        if (c.identity_request != MPI_REQUEST_NULL || waits_behind) {
          behind.push_back(m.peer);
        } else {  // the sender's identity is in: the payload may come if it is the one expected
          const Identity expected = identity_of(m);
          if (c.identity.tag != expected.tag || c.identity.bytes != expected.bytes ||
              std::strncmp(c.identity.what, expected.what, sizeof(expected.what)) != 0) {
            give_up("stage " + std::to_string(m.peer) + " sent " + std::string(c.identity.what) + " (" +
                    std::to_string(c.identity.bytes) + " bytes) where this stage posted the receive for " + m.what +
                    " (" + std::to_string(expected.bytes) + " bytes): the two stages post this link's messages in " +
                    "different orders, and NCCL, which matches them in posting order, would hand over the wrong tensor");
          }
          check(MPI_Irecv(m.tensor.data_ptr(), static_cast<int>(m.tensor.nbytes()), MPI_BYTE, m.peer, kPayloadTag,
                          links_, &c.payload_request),
                m);
          c.payload_posted = true;
          moved = true;
        }
      }
      if (c.payload_posted && c.payload_request != MPI_REQUEST_NULL) {
        check(MPI_Test(&c.payload_request, &flag, MPI_STATUS_IGNORE), m);
        moved = moved || flag;
      }
      complete = complete && c.complete();
    }
    if (complete) break;
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited > timeout()) {
      std::string pending;
      for (const Call& c : calls) {
        if (!c.complete()) pending += (pending.empty() ? "" : "; ") + call_words(*c.message);
      }
      give_up("a group of " + std::to_string(calls.size()) + " call(s) has not completed after " +
           std::to_string(timeout()) + " s (parallel.timeout_s); still waiting: this stage " + pending +
           ". On NCCL, which matches each link's messages in posting order and holds a rank's stream until each "
           "call meets its match, this waits for ever: a deadlock, or a stage that died or hangs");
    }
    if (!moved) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  for (auto& [device, host] : landing) device.copy_(host);
  return std::make_unique<CompletedTransfer>();
}

}  // namespace ht

#include "parallel/mpi_communicator.h"

#include "parallel/stall_note.h"

#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <limits>
#include <optional>
#include <shared_mutex>
#include <stdexcept>
#include <thread>
#include <string>

namespace ht {
namespace {

MPI_Datatype mpi_type(const at::Tensor& t, const char* what) {
  switch (t.scalar_type()) {
    case at::kFloat: return MPI_FLOAT;
    case at::kDouble: return MPI_DOUBLE;
    case at::kLong: return MPI_INT64_T;
    case at::kInt: return MPI_INT32_T;
    default:
      throw std::runtime_error(std::string("MPI collective on ") + what + ": " + c10::toString(t.scalar_type()) +
                               " tensors are not supported (float, double, int32, int64 are)");
  }
}

// For moving bytes without arithmetic: an unsigned type of the element's size, so that counts
// stay element counts for any dtype (bf16 included, which MPI has no type for).
MPI_Datatype mpi_bytes_type(const at::Tensor& t) {
  switch (t.element_size()) {
    case 1: return MPI_UINT8_T;
    case 2: return MPI_UINT16_T;
    case 4: return MPI_UINT32_T;
    default: return MPI_UINT64_T;
  }
}

// MPI has no 16-bit float types: bf16 and fp16 are summed in fp32 and rounded once (tensor
// parallelism's activations under bf16 autocast stopped in "BFloat16 tensors are not supported").
bool sums_in_float(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf;
}

void check_tensor(const at::Tensor& t, const char* what) {
  if (!t.is_cpu() || !t.is_contiguous()) {
    throw std::runtime_error(std::string("MPI collective on ") + what + ": needs a contiguous CPU tensor");
  }
}

}  // namespace

// While alive, the watchdog times the collective it names.
class MpiCommunicator::Watched {
 public:
  Watched(MpiCommunicator& c, const char* collective, const char* what) : c_(c) {
    std::lock_guard<std::mutex> lock(c_.mutex_);
    c_.current_ = std::string(collective) + " of " + what;
    // Collectives only: a stage's transfers finished by polling are never watched, so their
    // counts would differ between ranks.
    if (std::strcmp(collective, "the send") != 0 && std::strcmp(collective, "the receive") != 0) ++c_.sequence_;
    c_.current_context_ = c_.context();  // copies: the watchdog thread reads only these
    c_.current_timeout_ = c_.timeout();
    c_.since_ = std::chrono::steady_clock::now();
  }
  ~Watched() {
    std::lock_guard<std::mutex> lock(c_.mutex_);
    c_.current_.clear();
  }

 private:
  MpiCommunicator& c_;
};

namespace {

constexpr int kCallTag = 1, kAnswerTag = 2;

// Held shared by a watchdog while it calls MPI, exclusively by stop_roll_calls.
std::shared_mutex g_roll_calls;
bool g_roll_calls_stopped = false;

int thread_level() {
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  return level;
}

}  // namespace

void stop_roll_calls() {
  const std::unique_lock<std::shared_mutex> lock(g_roll_calls);
  g_roll_calls_stopped = true;
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, int world_rank) : comm_(comm), world_rank_(world_rank) {
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  // Every rank constructs its communicators in the same order: the duplicate is collective.
  if (size_ > 1 && thread_level() == MPI_THREAD_MULTIPLE) {
    MPI_Comm_dup(comm_, &roll_);
    MPI_Comm_set_errhandler(roll_, MPI_ERRORS_RETURN);
  }
  world_of_.resize(static_cast<size_t>(size_));
  MPI_Group group, world;
  MPI_Comm_group(comm_, &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  std::vector<int> ranks(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) ranks[static_cast<size_t>(r)] = r;
  MPI_Group_translate_ranks(group, size_, ranks.data(), world, world_of_.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  watchdog_ = std::thread([this] { watchdog(); });
}

MpiCommunicator::~MpiCommunicator() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  watchdog_.join();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    if (roll_ != MPI_COMM_NULL) MPI_Comm_free(&roll_);
    MPI_Comm_free(&comm_);
  }
}

MpiCommunicator::Whereabouts MpiCommunicator::whereabouts() {
  Whereabouts w;
  const std::lock_guard<std::mutex> lock(mutex_);
  w.world_rank = world_rank_;
  w.sequence = sequence_;
  w.waiting = current_.empty() ? 0 : 1;
  const std::string words = current_.empty() ? std::string("between collectives") : current_;
  std::snprintf(w.collective, sizeof w.collective, "%s", words.c_str());
  return w;
}

// A caller's message is answered with where this rank is; the answer is small (sent eagerly) and
// never waited for: the caller may be gone.
void MpiCommunicator::answer_roll_calls() {
  if (roll_ == MPI_COMM_NULL) return;
  const std::shared_lock<std::shared_mutex> lock(g_roll_calls);
  if (!g_roll_calls_stopped) answer_pending_calls();
}

void MpiCommunicator::answer_pending_calls() {
  for (int flag = 1; flag;) {
    MPI_Status status;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kCallTag, roll_, &flag, &status) != MPI_SUCCESS || !flag) return;
    Whereabouts theirs;
    MPI_Recv(&theirs, sizeof theirs, MPI_BYTE, status.MPI_SOURCE, kCallTag, roll_, MPI_STATUS_IGNORE);
    // Never waited for nor freed: the caller may have ended (a wait could then hold this thread,
    // and stop_roll_calls with it, forever). Roll calls are rare; a few bytes each.
    const Whereabouts* mine = new Whereabouts(whereabouts());
    MPI_Request request = MPI_REQUEST_NULL;
    if (MPI_Isend(mine, sizeof *mine, MPI_BYTE, status.MPI_SOURCE, kAnswerTag, roll_, &request) == MPI_SUCCESS) {
      MPI_Request_free(&request);
    }
  }
}

// Asks every other rank where it is and listens until `deadline_s`: the ranks that did not answer
// (stopped, hung in a kernel, dead), and those that did, at which collective.
std::string MpiCommunicator::call_the_roll(double deadline_s) {
  if (roll_ == MPI_COMM_NULL) {
    return "; which rank is missing is not known (this MPI gives no MPI_THREAD_MULTIPLE, which the roll call needs)";
  }
  const std::shared_lock<std::shared_mutex> lock(g_roll_calls);
  if (g_roll_calls_stopped) return "";
  // Never freed: a call to a rank that never takes it stays pending until the process ends.
  const Whereabouts* mine = new Whereabouts(whereabouts());
  std::vector<MPI_Request> calls;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    MPI_Request call = MPI_REQUEST_NULL;
    if (MPI_Isend(mine, sizeof *mine, MPI_BYTE, r, kCallTag, roll_, &call) == MPI_SUCCESS) calls.push_back(call);
  }
  std::vector<std::optional<Whereabouts>> answers(static_cast<size_t>(size_));
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < deadline_s) {
    answer_pending_calls();  // another rank that timed out calls too
    for (int tag : {kAnswerTag}) {
      int flag = 0;
      MPI_Status status;
      if (MPI_Iprobe(MPI_ANY_SOURCE, tag, roll_, &flag, &status) != MPI_SUCCESS || !flag) continue;
      Whereabouts theirs;
      MPI_Recv(&theirs, sizeof theirs, MPI_BYTE, status.MPI_SOURCE, tag, roll_, MPI_STATUS_IGNORE);
      answers[static_cast<size_t>(status.MPI_SOURCE)] = theirs;
    }
    int missing = 0;
    for (int r = 0; r < size_; ++r) missing += r != rank_ && !answers[static_cast<size_t>(r)];
    if (missing == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (MPI_Request& call : calls) MPI_Request_free(&call);  // a missing rank never takes its call
  std::string absent, present;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const std::string name = std::to_string(world_of_[static_cast<size_t>(r)]);
    const std::optional<Whereabouts>& a = answers[static_cast<size_t>(r)];
    if (!a) {
      absent += (absent.empty() ? "" : ", ") + name;
      continue;
    }
    const std::string at = a->waiting ? "waiting in collective " + std::to_string(a->sequence) + " (" + a->collective + ")"
                                      : "between collectives, " + std::to_string(a->sequence) + " begun";
    present += (present.empty() ? "" : "; ") + std::string("rank ") + name + " " + at;
  }
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%g", deadline_s);
  std::string text = "; roll call (" + std::string(seconds) + " s): ";
  text += absent.empty() ? std::string("every rank answered")
                         : "rank" + std::string(absent.find(',') == std::string::npos ? " " : "s ") + absent +
                               " never answered (stopped, dead, or ended by a timeout of its own; a rank stuck in a kernel answers, "
                               "between collectives)";
  if (!present.empty()) text += "; " + present;
  return text;
}

void MpiCommunicator::watchdog() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    wake_.wait_for(lock, std::chrono::milliseconds(100));
    if (stop_) break;
    const bool timed_out = !current_.empty() &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - since_).count() > current_timeout_;
    if (!timed_out) {
      lock.unlock();
      answer_roll_calls();
      lock.lock();
      continue;
    }
    const std::string collective = current_, context = current_context_;
    const int64_t sequence = sequence_;
    const double timeout = current_timeout_;
    lock.unlock();
    // Long enough for a rank that is only slow to answer (its watchdog wakes every 0.1 s).
    const std::string roll = call_the_roll(std::clamp(timeout / 5, 1.0, 10.0));
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%g", timeout);
    const std::string note = stall_note();
    const bool point_to_point = collective.rfind("the send", 0) == 0 || collective.rfind("the receive", 0) == 0;
    const std::string number = (point_to_point ? "after collective " : "collective ") + std::to_string(sequence) +
                               " of this group of " + std::to_string(size_);
    std::fprintf(stderr, "hybrid_train: error: rank %d, %s: %s (%s) did not complete within %s s: another rank has "
                 "died or hangs (parallel.timeout_s sets this limit)%s%s%s\n",
                 world_rank_, context.c_str(), collective.c_str(), number.c_str(), seconds, roll.c_str(),
                 note.empty() ? "" : ". ", note.c_str());
    std::fflush(stderr);
    std::_Exit(1);  // the collective holds this rank's main thread; mpirun sees the exit and ends the job
  }
}

void MpiCommunicator::check(int rc, const char* collective, const char* what) const {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(rc, text, &length);
  throw CommunicationError("rank " + std::to_string(world_rank_) + ", " + context() + ": " + collective + " of " + what +
                           " failed: " + std::string(text, static_cast<size_t>(length)));
}

void MpiCommunicator::allreduce_sum(at::Tensor& t, const char* what) {
  if (!t.is_cpu()) {  // a device tensor crosses through host memory (several ranks on one GPU)
    at::Tensor host = t.cpu();
    allreduce_sum(host, what);
    t.copy_(host);
    return;
  }
  check_tensor(t, what);
  if (sums_in_float(t)) {
    at::Tensor wide = t.to(at::kFloat);
    allreduce_sum(wide, what);
    t.copy_(wide);
    return;
  }
  Watched watched(*this, "the all-reduce", what);
  check(MPI_Allreduce(MPI_IN_PLACE, t.data_ptr(), static_cast<int>(t.numel()), mpi_type(t, what), MPI_SUM, comm_),
        "the all-reduce", what);
}

void MpiCommunicator::broadcast(at::Tensor& t, int root, const char* what) {
  if (!t.is_cpu()) {
    at::Tensor host = t.cpu();
    broadcast(host, root, what);
    t.copy_(host);
    return;
  }
  check_tensor(t, what);
  Watched watched(*this, "the broadcast", what);
  check(MPI_Bcast(t.data_ptr(), static_cast<int>(t.numel()), mpi_bytes_type(t), root, comm_), "the broadcast", what);
}

namespace {

// MPI's counts are ints.
std::vector<int> int_counts(const std::vector<int64_t>& counts, const char* collective, const char* what) {
  std::vector<int> out;
  out.reserve(counts.size());
  for (int64_t c : counts) {
    if (c > std::numeric_limits<int>::max()) {
      throw std::runtime_error(std::string(collective) + " of " + what + ": " + std::to_string(c) +
                               " elements for one rank, more than MPI's counts hold (2^31 - 1); use smaller buckets");
    }
    out.push_back(static_cast<int>(c));
  }
  return out;
}

}  // namespace

void MpiCommunicator::reduce_scatter_sum(const at::Tensor& full, at::Tensor& shard, const std::vector<int64_t>& counts,
                                         const char* what) {
  if (!full.is_cpu() || !shard.is_cpu()) {
    at::Tensor host = shard.cpu();
    reduce_scatter_sum(full.cpu(), host, counts, what);
    shard.copy_(host);
    return;
  }
  check_tensor(full, what);
  check_tensor(shard, what);
  check_shard_arguments(*this, full, shard, counts, "the reduce-scatter", what);
  if (sums_in_float(full)) {
    const at::Tensor wide = full.to(at::kFloat);
    at::Tensor wide_shard = shard.to(at::kFloat);
    reduce_scatter_sum(wide, wide_shard, counts, what);
    shard.copy_(wide_shard);
    return;
  }
  const std::vector<int> ints = int_counts(counts, "the reduce-scatter", what);
  Watched watched(*this, "the reduce-scatter", what);
  check(MPI_Reduce_scatter(full.data_ptr(), shard.data_ptr(), ints.data(), mpi_type(full, what), MPI_SUM, comm_),
        "the reduce-scatter", what);
}

void MpiCommunicator::all_gather(const at::Tensor& shard, at::Tensor& full, const std::vector<int64_t>& counts,
                                 const char* what) {
  if (!full.is_cpu() || !shard.is_cpu()) {
    at::Tensor host = full.cpu();
    all_gather(shard.cpu(), host, counts, what);
    full.copy_(host);
    return;
  }
  check_tensor(full, what);
  check_tensor(shard, what);
  const int64_t offset = check_shard_arguments(*this, full, shard, counts, "the all-gather", what);
  const std::vector<int> ints = int_counts(counts, "the all-gather", what);
  std::vector<int> displacements(ints.size());
  int64_t at = 0;
  for (size_t r = 0; r < ints.size(); ++r) {
    if (at > std::numeric_limits<int>::max()) {
      throw std::runtime_error(std::string("the all-gather of ") + what + ": offsets past 2^31 - 1 elements; use smaller buckets");
    }
    displacements[r] = static_cast<int>(at);
    at += counts[r];
  }
  const MPI_Datatype type = mpi_bytes_type(full);
  const bool in_place = static_cast<const char*>(shard.data_ptr()) ==
                        static_cast<const char*>(full.data_ptr()) + offset * static_cast<int64_t>(full.element_size());
  Watched watched(*this, "the all-gather", what);
  check(MPI_Allgatherv(in_place ? MPI_IN_PLACE : shard.data_ptr(), in_place ? 0 : ints[static_cast<size_t>(rank_)],
                       type, full.data_ptr(), ints.data(), displacements.data(), type, comm_),
        "the all-gather", what);
}

void MpiCommunicator::send(const at::Tensor& t, int to, const char* what) {
  if (!t.is_cpu()) {
    send(t.cpu(), to, what);
    return;
  }
  check_tensor(t, what);
  Watched watched(*this, "the send", what);
  check(MPI_Send(t.data_ptr(), static_cast<int>(t.numel()), mpi_bytes_type(t), to, 0, comm_), "the send", what);
}

void MpiCommunicator::recv(at::Tensor& t, int from, const char* what) {
  if (!t.is_cpu()) {
    at::Tensor host = at::empty(t.sizes(), t.options().device(at::kCPU));
    recv(host, from, what);
    t.copy_(host);
    return;
  }
  check_tensor(t, what);
  Watched watched(*this, "the receive", what);
  check(MPI_Recv(t.data_ptr(), static_cast<int>(t.numel()), mpi_bytes_type(t), from, 0, comm_, MPI_STATUS_IGNORE),
        "the receive", what);
}

class MpiCommunicator::MpiTransfer final : public Transfer {
 public:
  MpiTransfer(MpiCommunicator& c, at::Tensor t, bool send, std::string what, at::Tensor device = {})
      : c_(c), tensor_(std::move(t)), device_(std::move(device)), send_(send), what_(std::move(what)),
        context_(c.context()) {}
  ~MpiTransfer() override {
    if (request_ == MPI_REQUEST_NULL) return;
    try {
      wait();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "hybrid_train: error: %s\n", e.what());  // a destructor cannot throw
    }
  }
  MPI_Request* request() { return &request_; }
  bool done() override {
    if (request_ == MPI_REQUEST_NULL) return true;
    int flag = 0;
    c_.check(MPI_Test(&request_, &flag, MPI_STATUS_IGNORE), send_ ? "the send" : "the receive", what_.c_str());
    if (flag != 0) arrived();
    return flag != 0;
  }
  void wait() override {
    if (request_ == MPI_REQUEST_NULL) {
      arrived();
      return;
    }
    const std::string saved = c_.context();
    c_.set_context(context_);  // the step and stage it was posted in, for the watchdog's message
    {
      Watched watched(c_, send_ ? "the send" : "the receive", what_.c_str());
      const int rc = MPI_Wait(&request_, MPI_STATUS_IGNORE);
      c_.set_context(saved);
      c_.check(rc, send_ ? "the send" : "the receive", what_.c_str());
    }
    arrived();
  }

 private:
  // A receive into a device tensor landed in host memory: it goes on to the device now.
  void arrived() {
    if (!device_.defined()) return;
    device_.copy_(tensor_);
    device_ = at::Tensor();
  }

  MpiCommunicator& c_;
  at::Tensor tensor_;  // alive until the message is done (a device tensor's host copy)
  at::Tensor device_;  // a receive's device tensor, filled from tensor_ when it arrives
  bool send_;
  std::string what_, context_;
  MPI_Request request_ = MPI_REQUEST_NULL;
};

std::unique_ptr<Transfer> MpiCommunicator::isend(const at::Tensor& t, int to, int tag, const std::string& what) {
  if (!t.is_cpu()) return isend(t.cpu(), to, tag, what);  // its host copy is the message
  check_tensor(t, what.c_str());
  auto transfer = std::make_unique<MpiTransfer>(*this, t, true, what);
  check(MPI_Isend(t.data_ptr(), static_cast<int>(t.nbytes()), MPI_BYTE, to, tag, comm_, transfer->request()),
        "the send", what.c_str());
  return transfer;
}

std::unique_ptr<Transfer> MpiCommunicator::irecv(at::Tensor& t, int from, int tag, const std::string& what) {
  at::Tensor host = t.is_cpu() ? t : at::empty(t.sizes(), t.options().device(at::kCPU));
  check_tensor(host, what.c_str());
  auto transfer = std::make_unique<MpiTransfer>(*this, host, false, what, t.is_cpu() ? at::Tensor() : t);
  check(MPI_Irecv(host.data_ptr(), static_cast<int>(host.nbytes()), MPI_BYTE, from, tag, comm_, transfer->request()),
        "the receive", what.c_str());
  return transfer;
}

bool MpiCommunicator::allows_worker_thread() const {
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  return level >= MPI_THREAD_SERIALIZED;
}

void MpiCommunicator::idle_barrier(const char* what) {
  Watched watched(*this, "the barrier", what);
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Ibarrier(comm_, &request), "the barrier", what);
  for (int done = 0; !done;) {
    check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "the barrier", what);
    if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void MpiCommunicator::barrier(const char* what) {
  Watched watched(*this, "the barrier", what);
  check(MPI_Barrier(comm_), "the barrier", what);
}

}  // namespace ht

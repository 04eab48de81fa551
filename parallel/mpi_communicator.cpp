#include "parallel/mpi_communicator.h"

#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>

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

void check_tensor(const at::Tensor& t, const char* what) {
  if (!t.is_cpu() || !t.is_contiguous()) {
    throw std::runtime_error(std::string("MPI collective on ") + what + ": needs a contiguous CPU tensor");
  }
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, int world_rank) : comm_(comm), world_rank_(world_rank) {
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&comm_);
}

void MpiCommunicator::check(int rc, const char* collective, const char* what) const {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(rc, text, &length);
  throw CommunicationError("rank " + std::to_string(world_rank_) + ", " + context() + ": " + collective + " of " + what +
                           " failed: " + std::string(text, static_cast<size_t>(length)));
}

void MpiCommunicator::wait(MPI_Request& request, const char* collective, const char* what) const {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const auto limit = std::chrono::duration<double>(timeout());
  int done = 0;
  for (int polls = 0;; ++polls) {
    check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), collective, what);
    if (done) return;
    if (clock::now() - start > limit) {
      char seconds[32];
      std::snprintf(seconds, sizeof seconds, "%g", timeout());
      throw CommunicationError("rank " + std::to_string(world_rank_) + ", " + context() + ": " + collective + " of " +
                               what + " did not complete within " + seconds + " s: another rank has died or hangs "
                               "(parallel.timeout_s sets this limit)");
    }
    // Spin first (collectives are usually quick), then yield the core to the ranks we wait for.
    if (polls > 2000) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

void MpiCommunicator::allreduce_sum(at::Tensor& t, const char* what) {
  check_tensor(t, what);
  MPI_Request request;
  check(MPI_Iallreduce(MPI_IN_PLACE, t.data_ptr(), static_cast<int>(t.numel()), mpi_type(t, what), MPI_SUM, comm_,
                       &request),
        "the all-reduce", what);
  wait(request, "the all-reduce", what);
}

void MpiCommunicator::broadcast(at::Tensor& t, int root, const char* what) {
  check_tensor(t, what);
  MPI_Request request;
  check(MPI_Ibcast(t.data_ptr(), static_cast<int>(t.numel()), mpi_type(t, what), root, comm_, &request),
        "the broadcast", what);
  wait(request, "the broadcast", what);
}

void MpiCommunicator::barrier(const char* what) {
  MPI_Request request;
  check(MPI_Ibarrier(comm_, &request), "the barrier", what);
  wait(request, "the barrier", what);
}

}  // namespace ht

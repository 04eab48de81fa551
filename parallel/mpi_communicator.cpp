#include "parallel/mpi_communicator.h"

#include <ATen/ATen.h>

#include <stdexcept>
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
  throw std::runtime_error("rank " + std::to_string(world_rank_) + ": " + collective + " of " + what +
                           " failed: " + std::string(text, static_cast<size_t>(length)));
}

void MpiCommunicator::allreduce_sum(at::Tensor& t, const char* what) {
  check_tensor(t, what);
  check(MPI_Allreduce(MPI_IN_PLACE, t.data_ptr(), static_cast<int>(t.numel()), mpi_type(t, what), MPI_SUM, comm_),
        "MPI_Allreduce", what);
}

void MpiCommunicator::broadcast(at::Tensor& t, int root, const char* what) {
  check_tensor(t, what);
  check(MPI_Bcast(t.data_ptr(), static_cast<int>(t.numel()), mpi_type(t, what), root, comm_), "MPI_Bcast", what);
}

void MpiCommunicator::barrier(const char* what) { check(MPI_Barrier(comm_), "MPI_Barrier", what); }

}  // namespace ht

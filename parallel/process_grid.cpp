#include "parallel/process_grid.h"

#include <cstdlib>
#include <stdexcept>

#ifdef HT_HAVE_MPI
#include "parallel/mpi_communicator.h"

#include <mpi.h>
#endif

namespace ht {

bool launched_by_mpi() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(name) != nullptr) return true;
  return false;
}

ProcessGrid make_process_grid() {
  ProcessGrid grid;
  if (!launched_by_mpi()) return grid;
#ifdef HT_HAVE_MPI
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    // SERIALIZED: all-reduces run on a worker thread while backward computes (one MPI call at a
    // time); with less, DataParallel reduces on the main thread after backward.
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &grid.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &grid.world);
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, grid.rank, MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, &grid.local_rank);
  MPI_Comm_size(local, &grid.local_size);
  MPI_Comm_free(&local);
  divide_process_grid(grid, 1);
  return grid;
#else
  throw std::runtime_error("started by mpirun, but this build of hybrid_train has no MPI; install "
                           "libopenmpi-dev and rebuild, or run without mpirun");
#endif
}

void divide_process_grid(ProcessGrid& grid, int pipeline_parallel) {
  if (pipeline_parallel < 1 || grid.world % pipeline_parallel != 0) {
    throw std::invalid_argument("the world of " + std::to_string(grid.world) + " ranks does not divide into " +
                                std::to_string(pipeline_parallel) + " pipeline stages");
  }
  grid.pipeline_parallel = pipeline_parallel;
  grid.data_parallel = grid.world / pipeline_parallel;
  grid.stage = grid.rank / grid.data_parallel;
#ifdef HT_HAVE_MPI
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return;  // not under mpirun: a world of one keeps its local groups
  MPI_Comm replicas, pipeline;
  MPI_Comm_split(MPI_COMM_WORLD, grid.stage, grid.rank, &replicas);
  MPI_Comm_split(MPI_COMM_WORLD, grid.rank % grid.data_parallel, grid.stage, &pipeline);
  grid.data_parallel_group = std::make_shared<MpiCommunicator>(replicas, grid.rank);
  grid.pipeline_group = std::make_shared<MpiCommunicator>(pipeline, grid.rank);
#endif
}

void abort_process_grid(int code) {
#ifdef HT_HAVE_MPI
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
#else
  (void)code;
#endif
}

void finalize_process_grid() {
#ifdef HT_HAVE_MPI
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Finalize();
#endif
}

}  // namespace ht

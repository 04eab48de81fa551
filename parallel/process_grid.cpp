#include "parallel/process_grid.h"

#include <cstdio>
#include <cstdlib>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

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
    // MULTIPLE: each communicator's watchdog calls the roll while the main thread waits in a
    // collective (mpi_communicator.h); SERIALIZED at least: all-reduces run on a worker thread
    // while backward computes; with less, DataParallel reduces on the main thread after backward.
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
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

void divide_process_grid(ProcessGrid& grid, int pipeline_parallel, int tensor_parallel, int context_parallel) {
  const int per_replica = pipeline_parallel * tensor_parallel * context_parallel;
  if (pipeline_parallel < 1 || tensor_parallel < 1 || context_parallel < 1 || grid.world % per_replica != 0) {
    throw std::invalid_argument("the world of " + std::to_string(grid.world) + " ranks does not divide into " +
                                std::to_string(pipeline_parallel) + " pipeline stages of " +
                                std::to_string(context_parallel) + " context ranks of " +
                                std::to_string(tensor_parallel) + "-rank tensor-parallel groups");
  }
  const int tp = tensor_parallel, cp = context_parallel;
  grid.pipeline_parallel = pipeline_parallel;
  grid.tensor_parallel = tp;
  grid.context_parallel = cp;
  grid.data_parallel = grid.world / per_replica;
  grid.tensor_rank = grid.rank % tp;
  grid.context_rank = grid.rank / tp % cp;
  grid.replica = grid.rank / (tp * cp) % grid.data_parallel;
  grid.stage = grid.rank / (tp * cp * grid.data_parallel);
#ifdef HT_HAVE_MPI
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return;  // not under mpirun: a world of one keeps its local groups
  MPI_Comm replicas, pipeline, tensor, context;
  const int same_weights = grid.replica * cp + grid.context_rank;  // its rank among the ranks with its weights
  MPI_Comm_split(MPI_COMM_WORLD, grid.stage * tp + grid.tensor_rank, same_weights, &replicas);
  MPI_Comm_split(MPI_COMM_WORLD, same_weights * tp + grid.tensor_rank, grid.stage, &pipeline);
  MPI_Comm_split(MPI_COMM_WORLD, grid.rank / tp, grid.tensor_rank, &tensor);
  MPI_Comm_split(MPI_COMM_WORLD, (grid.stage * grid.data_parallel + grid.replica) * tp + grid.tensor_rank,
                 grid.context_rank, &context);
  grid.data_parallel_group = std::make_shared<MpiCommunicator>(replicas, grid.rank);
  grid.pipeline_group = std::make_shared<MpiCommunicator>(pipeline, grid.rank);
  grid.tensor_parallel_group = std::make_shared<MpiCommunicator>(tensor, grid.rank);
  grid.context_parallel_group = std::make_shared<MpiCommunicator>(context, grid.rank);
#endif
}

std::string tensor_groups_across_hosts(const ProcessGrid& grid) {
  if (grid.tensor_parallel <= 1) return {};
#ifdef HT_HAVE_MPI
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return {};
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  MPI_Get_processor_name(name, &length);
  // Every rank's host name, as fixed-width rows.
  std::vector<char> hosts(static_cast<size_t>(grid.world) * MPI_MAX_PROCESSOR_NAME);
  MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, hosts.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, MPI_COMM_WORLD);
  auto host = [&](int r) { return std::string(&hosts[static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME]); };
  for (int first = 0; first < grid.world; first += grid.tensor_parallel) {
    bool one_host = true;
    for (int r = first + 1; r < first + grid.tensor_parallel; ++r) one_host &= host(r) == host(first);
    if (one_host) continue;
    std::string text = "the tensor-parallel group of ranks " + std::to_string(first) + ".." +
                       std::to_string(first + grid.tensor_parallel - 1) + " spans hosts (";
    for (int r = first; r < first + grid.tensor_parallel; ++r) {
      text += (r > first ? ", " : "") + std::string("rank ") + std::to_string(r) + " on " + host(r);
    }
    return text + ")";
  }
#endif
  return {};
}

bool ranks_share_a_device(const ProcessGrid& grid, const std::string& device_id) {
  if (grid.world <= 1) return false;
#ifdef HT_HAVE_MPI
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return false;
  // Every rank's device, as fixed-width rows.
  constexpr int kWidth = 64;
  std::vector<char> mine(kWidth, 0), all(static_cast<size_t>(grid.world) * kWidth);
  std::snprintf(mine.data(), kWidth, "%s", device_id.c_str());
  MPI_Allgather(mine.data(), kWidth, MPI_CHAR, all.data(), kWidth, MPI_CHAR, MPI_COMM_WORLD);
  std::set<std::string> seen;
  for (int r = 0; r < grid.world; ++r) {
    const std::string id(&all[static_cast<size_t>(r) * kWidth]);
    if (!id.empty() && !seen.insert(id).second) return true;
  }
#else
  (void)device_id;
#endif
  return false;
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
  if (initialized && !finalized) {
    stop_roll_calls();
    MPI_Finalize();
  }
#endif
}

}  // namespace ht

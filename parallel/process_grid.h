#pragma once
// The ranks of a job and how they divide the work: world = tensor-parallel ranks x context-parallel
// ranks x data-parallel replicas x pipeline stages, ordered as Megatron and torchtitan order them:
// tensor parallelism innermost (neighbouring ranks, one host: NVLink on a GPU node; its
// collectives run inside every sub-layer), then context parallelism (an exchange per attention,
// larger and fewer: next to it, on the same host while tp x cp ranks fit one), then data
// parallelism (once a step), pipeline stages outermost. Rank = ((stage x dp + replica) x cp +
// context rank) x tp + tensor rank. The tp ranks with the same stage, replica and context rank
// form a tensor-parallel group; the cp ranks with the same stage, replica and tensor rank a
// context group (its rank is the context rank: which chunks of each sequence); the ranks with the
// same stage and tensor rank hold the same weights, and form the data-parallel group, dp x cp
// ranks whose gradients are averaged (torchtitan shards over dp_shard x cp alike; its rank is
// replica x cp + context rank); those with the same replica, context rank and tensor rank one
// pipeline (its rank is the stage). Rank 0 is stage 0 of replica 0, context rank 0, tensor rank 0. Under mpirun the grid comes from MPI (rank, world, local rank by a
// shared-memory split) and its groups are MPI sub-communicators;
// without mpirun it is a world of one and MPI is never initialized, so a single process, or a
// build without MPI, runs unchanged.

#include "parallel/communicator.h"

#include <memory>
#include <string>

namespace ht {

struct ProcessGrid {
  int rank = 0, world = 1;
  int local_rank = 0;  // rank among the processes on this host: which GPU to use
  int local_size = 1;  // processes of this job on this host: they share its cores
  int data_parallel = 1, pipeline_parallel = 1, tensor_parallel = 1, context_parallel = 1;
  int stage = 0;         // this rank's pipeline stage
  int replica = 0;       // its data-parallel replica (which samples of a batch)
  int context_rank = 0;  // its rank in its context group (which chunks of each sequence)
  int tensor_rank = 0;   // its rank in its tensor-parallel group
  // The ranks with this rank's weights: data_parallel x context_parallel of them.
  std::shared_ptr<Communicator> data_parallel_group = std::make_shared<LocalCommunicator>();
  std::shared_ptr<Communicator> context_parallel_group = std::make_shared<LocalCommunicator>();
  std::shared_ptr<Communicator> pipeline_group = std::make_shared<LocalCommunicator>();
  std::shared_ptr<Communicator> tensor_parallel_group = std::make_shared<LocalCommunicator>();
  bool is_root() const { return rank == 0; }
};

// True when this process was started by an MPI launcher (mpirun, srun with PMI).
bool launched_by_mpi();

// The grid of this process: MPI's when launched_by_mpi() (initializing MPI), else a world of one;
// every rank one data-parallel replica. Throws std::runtime_error when launched by mpirun in a
// build without MPI.
ProcessGrid make_process_grid();
// Divides the world into `pipeline_parallel` stages of world / (pipeline_parallel x
// context_parallel x tensor_parallel) replicas of `context_parallel` groups of `tensor_parallel`
// ranks each (divisors checked by the caller). Collective: every rank calls it alike.
void divide_process_grid(ProcessGrid& grid, int pipeline_parallel, int tensor_parallel = 1, int context_parallel = 1);
// With tensor parallelism: every tensor-parallel group's ranks run on one host (their collectives
// run inside every layer), or a message naming the group's ranks and their hosts. Collective.
std::string tensor_groups_across_hosts(const ProcessGrid& grid);

// Whether two ranks of the job use one device: the same `device_id` (a GPU's UUID, unique across
// machines; "" where a rank has none, never alike). Collective: every rank calls it alike, and all
// get the same answer. False for a world of one.
bool ranks_share_a_device(const ProcessGrid& grid, const std::string& device_id);

// Ends MPI if make_process_grid started it (call once, at exit).
void finalize_process_grid();
// Ends every rank of the job with `code` (MPI_Abort): for an error on one rank while the others
// may be waiting in a collective. Without MPI it returns and the caller exits.
void abort_process_grid(int code);

}  // namespace ht

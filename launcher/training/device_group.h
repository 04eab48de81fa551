#pragma once
// Which device a rank computes on, and the group its replicas average gradients over. On the CPU:
// the MPI group as it is. With training.device = "cuda" under mpirun: the GPU of the rank's local
// rank (among the GPUs it sees) and NCCL between the replicas, set up by MPI.

#include "launcher/config/config.h"
#include "parallel/process_grid.h"

#include <memory>

namespace ht {

// Resolves config.training.device = "cuda" to "cuda:<local rank modulo visible GPUs>" under
// mpirun (a single process keeps "cuda", the current device), and returns the replicas' group.
// Throws UserError where the job needs what this build lacks (NCCL; pipelines over NCCL).
std::shared_ptr<Communicator> replica_group_for_device(Config& config, const ProcessGrid& grid);
// The tensor-parallel group's communicator on the device replica_group_for_device resolved (call
// after it): MPI's on the CPU, NCCL between the group's GPUs; null without tensor parallelism.
std::shared_ptr<Communicator> tensor_group_for_device(const Config& config, const ProcessGrid& grid);

}  // namespace ht

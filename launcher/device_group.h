#pragma once
// Which device a rank computes on, and the groups it trains in over that device. On the CPU: the
// MPI groups as they are. With training.device = "cuda" under mpirun: the GPU of the rank's local
// rank (among the GPUs it sees) and NCCL between the GPUs, set up by MPI.

#include "launcher/config/config.h"
#include "parallel/process_grid.h"
#include "training/run_plan.h"

#include <memory>
#include <string>

namespace ht {

// config.training.device for this rank: "cuda" becomes "cuda:<local rank modulo visible GPUs>"
// under mpirun (a single process keeps "cuda", the current device). Throws UserError where the job
// needs what this build lacks (NCCL).
std::string device_of_rank(const Config& config, const ProcessGrid& grid);
// The replicas' group on plan.device: the grid's on the CPU, NCCL between GPUs.
std::shared_ptr<Communicator> replica_group_for_device(const RunPlan& plan, const ProcessGrid& grid);
// The pipeline group on plan.device: NCCL between GPUs; on the CPU, MPI's as it is, or carrying
// messages as NCCL does (parallel.pipeline_p2p = "nccl_like"). The grid's without stages.
std::shared_ptr<Communicator> pipeline_group_for_device(const RunPlan& plan, const ProcessGrid& grid);
// The tensor-parallel group's communicator on plan.device: MPI's on the CPU, NCCL between the
// group's GPUs; null without tensor parallelism.
std::shared_ptr<Communicator> tensor_group_for_device(const RunPlan& plan, const ProcessGrid& grid);
// The context group's communicator on plan.device, as the tensor-parallel group's; null without
// context parallelism.
std::shared_ptr<Communicator> context_group_for_device(const RunPlan& plan, const ProcessGrid& grid);

}  // namespace ht

#include "launcher/device_group.h"

#include "alloc/cuda_arena.h"
#include "base/user_error.h"

#ifdef HT_HAVE_NCCL
#include "parallel/nccl_communicator.h"
#endif
#ifdef HT_HAVE_MPI
#include "parallel/nccl_like_communicator.h"
#endif

#include <cstdio>
#include <string>

namespace ht {

namespace {

// Whether two ranks of this job use one GPU (the same host and GPU UUID), `device` being this
// rank's ("cuda:N"). Collective: every rank asks alike, in the same order. NCCL refuses two ranks
// on one device (NVIDIA/nccl#418), so their groups stay MPI's, device tensors crossing through
// host memory: slow, for testing several ranks on one GPU.
bool ranks_share_gpus(const std::string& device, const ProcessGrid& grid) {
  if (device.rfind("cuda", 0) != 0 || grid.world == 1) return false;
  return ranks_share_a_device(grid, cuda_device_uuid(device.size() > 5 ? std::stoi(device.substr(5)) : 0));
}

}  // namespace

std::string device_of_rank(const Config& config, const ProcessGrid& grid) {
  const std::string& device = config.training.device;
  if (device.rfind("cuda", 0) != 0 || grid.world == 1) return device;
  const std::string where = config.source + ": training.device = \"" + device + "\" with " +
                            std::to_string(grid.world) + " ranks";
#ifdef HT_HAVE_NCCL
  const int gpus = visible_cuda_devices();
  if (gpus == 0) {
    ranks_share_a_device(grid, "");  // the others' collective, met before this rank stops
    throw UserError(where + ": this rank sees no GPU; check CUDA_VISIBLE_DEVICES, or use \"cpu\"");
  }
  const int index = device == "cuda" ? grid.local_rank % gpus : std::stoi(device.substr(5));
  if (ranks_share_gpus("cuda:" + std::to_string(index), grid) && grid.rank == 0) {
    std::fprintf(stderr,
                 "hybrid_train: warning: ranks of this job share a GPU (%d ranks on a node with %d visible): NCCL "
                 "refuses two ranks on one GPU, so the ranks exchange through host memory over MPI (slow; for "
                 "testing several ranks on one GPU)\n",
                 grid.local_size, gpus);
  }
  return "cuda:" + std::to_string(index);
#else
  throw UserError(where + ": averaging gradients between GPUs needs NCCL, and this build has none; rebuild where "
                  "the CUDA toolkit's NCCL is found (or give cmake -DHT_NCCL_ROOT=<folder with include/nccl.h>), "
                  "or use \"cpu\"");
#endif
}

std::shared_ptr<Communicator> replica_group_for_device(const RunPlan& plan, const ProcessGrid& grid) {
  if (plan.device.rfind("cuda", 0) != 0 || grid.world == 1 || ranks_share_gpus(plan.device, grid)) {
    return grid.data_parallel_group;
  }
#ifdef HT_HAVE_NCCL
  // Its all-reduces, reduce-scatters and prefetched gathers on a communication stream of their own,
  // overlapped with the kernels: queued from the computing thread, the compute stream waiting for
  // their events (parallel/stream_collectives.h).
  return std::make_shared<NcclCommunicator>(*grid.data_parallel_group, std::stoi(plan.device.substr(5)), grid.rank,
                                            /*side_stream=*/true);
#else
  return grid.data_parallel_group;  // device_of_rank refused it
#endif
}

std::shared_ptr<Communicator> pipeline_group_for_device(const RunPlan& plan, const ProcessGrid& grid) {
  if (grid.pipeline_parallel <= 1) return grid.pipeline_group;
  if (plan.device.rfind("cuda", 0) == 0 && !ranks_share_gpus(plan.device, grid)) {
#ifdef HT_HAVE_NCCL
    // Not yet run on GPUs (docs/gpu.md); the same posting runs on CPU ranks under nccl_like.
    return std::make_shared<NcclCommunicator>(*grid.pipeline_group, std::stoi(plan.device.substr(5)), grid.rank);
#else
    return grid.pipeline_group;  // device_of_rank refused it
#endif
  }
  if (plan.pipeline.p2p != PipelineP2p::kNcclLike) return grid.pipeline_group;
#ifdef HT_HAVE_MPI
  if (auto mpi = std::dynamic_pointer_cast<MpiCommunicator>(grid.pipeline_group)) {
    return std::make_shared<NcclLikeCommunicator>(std::move(mpi));
  }
#endif
  return grid.pipeline_group;  // not under mpirun: no stages to carry messages between
}

namespace {

// A group whose collectives run inside the layers (tensor-parallel, context), on plan.device:
// MPI's on the CPU (and where ranks share a GPU), NCCL between the group's GPUs, set up over its
// MPI communicator. `key` and `degree` name the axis in the error of a build without NCCL.
std::shared_ptr<Communicator> layer_group_for_device(const RunPlan& plan, const ProcessGrid& grid,
                                                     const std::shared_ptr<Communicator>& group, const char* key,
                                                     int degree) {
  const std::string& device = plan.device;
  if (device.rfind("cuda", 0) != 0 || ranks_share_gpus(device, grid)) return group;
#ifdef HT_HAVE_NCCL
  // The device is "cuda:<index>" by now. Not yet run on GPUs (docs/gpu.md).
  (void)key, (void)degree;
  const int index = device.size() > 5 ? std::stoi(device.substr(5)) : 0;
  return std::make_shared<NcclCommunicator>(*group, index, grid.rank);
#else
  throw UserError(plan.source + ": training.device = \"" + device + "\" with parallel." + key + " = " +
                  std::to_string(degree) + ": a group of GPUs needs NCCL, and this build has none; rebuild where the "
                  "CUDA toolkit's NCCL is found, or use \"cpu\"");
#endif
}

}  // namespace

std::shared_ptr<Communicator> tensor_group_for_device(const RunPlan& plan, const ProcessGrid& grid) {
  if (grid.tensor_parallel <= 1) return nullptr;
  return layer_group_for_device(plan, grid, grid.tensor_parallel_group, "tensor_parallel", grid.tensor_parallel);
}

std::shared_ptr<Communicator> context_group_for_device(const RunPlan& plan, const ProcessGrid& grid) {
  if (grid.context_parallel <= 1) return nullptr;
  return layer_group_for_device(plan, grid, grid.context_parallel_group, "context_parallel", grid.context_parallel);
}

}  // namespace ht

#include "launcher/device_group.h"

#include "base/user_error.h"

#ifdef HT_HAVE_NCCL
#include "parallel/nccl_communicator.h"
#endif

#include <string>

namespace ht {

std::string device_of_rank(const Config& config, const ProcessGrid& grid) {
  const std::string& device = config.training.device;
  if (device.rfind("cuda", 0) != 0 || grid.world == 1) return device;
  const std::string where = config.source + ": training.device = \"" + device + "\" with " +
                            std::to_string(grid.world) + " ranks";
  if (grid.pipeline_parallel > 1) {
    throw UserError(where + " and parallel.pipeline_parallel = " + std::to_string(grid.pipeline_parallel) +
                    ": pipeline stages on GPUs (NCCL's point to point) are not built; use data parallelism "
                    "alone on GPUs, or pipelines on \"cpu\"");
  }
#ifdef HT_HAVE_NCCL
  const int gpus = visible_cuda_devices();
  if (gpus == 0) throw UserError(where + ": this rank sees no GPU; check CUDA_VISIBLE_DEVICES, or use \"cpu\"");
  const int index = device == "cuda" ? grid.local_rank % gpus : std::stoi(device.substr(5));
  return "cuda:" + std::to_string(index);
#else
  throw UserError(where + ": averaging gradients between GPUs needs NCCL, and this build has none; rebuild where "
                  "the CUDA toolkit's NCCL is found (or give cmake -DHT_NCCL_ROOT=<folder with include/nccl.h>), "
                  "or use \"cpu\"");
#endif
}

std::shared_ptr<Communicator> replica_group_for_device(const RunPlan& plan, const ProcessGrid& grid) {
  if (plan.device.rfind("cuda", 0) != 0 || grid.world == 1) return grid.data_parallel_group;
#ifdef HT_HAVE_NCCL
  return std::make_shared<NcclCommunicator>(*grid.data_parallel_group, std::stoi(plan.device.substr(5)), grid.rank);
#else
  return grid.data_parallel_group;  // device_of_rank refused it
#endif
}

std::shared_ptr<Communicator> tensor_group_for_device(const RunPlan& plan, const ProcessGrid& grid) {
  if (grid.tensor_parallel <= 1) return nullptr;
  const std::string& device = plan.device;
  if (device.rfind("cuda", 0) != 0) return grid.tensor_parallel_group;
#ifdef HT_HAVE_NCCL
  // The device is "cuda:<index>" by now; the group's NCCL communicator is set up over its MPI one.
  // Not yet run on GPUs (docs/gpu.md).
  const int index = device.size() > 5 ? std::stoi(device.substr(5)) : 0;
  return std::make_shared<NcclCommunicator>(*grid.tensor_parallel_group, index, grid.rank);
#else
  throw UserError(plan.source + ": training.device = \"" + device + "\" with parallel.tensor_parallel = " +
                  std::to_string(grid.tensor_parallel) + ": a tensor-parallel group of GPUs needs NCCL, and this "
                  "build has none; rebuild where the CUDA toolkit's NCCL is found, or use \"cpu\"");
#endif
}

}  // namespace ht

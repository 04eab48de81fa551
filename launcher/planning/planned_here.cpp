#include "launcher/planning/planned_here.h"

#include "alloc/byte_size.h"
#include "alloc/cuda_arena.h"
#include "alloc/cuda_host_link.h"
#include "launcher/planning/device_catalog.h"

#include <algorithm>
#include <map>

namespace ht {
namespace {

// The GPU's host link measured (cuda_host_link_gbps), or 0 where it cannot be: the plan then prices
// copies at memory.host_link_gbps, and says nothing (the run's link fails by name if it must).
double host_link_rate(int device) {
  try {
    return cuda_host_link_gbps(device);
  } catch (const std::exception&) {
    return 0;
  }
}

}  // namespace

Config profiled_here(const Config& config) {
  Config c = config;
  c.cluster.device.clear();
  return c;
}

std::optional<Config> planned_here(const Config& config, const RunPlan& run, const ProcessGrid& grid, std::string& why) {
  if (config.training.device == "cpu") return profiled_here(config);
  const int device = run.device.size() > 5 ? std::stoi(run.device.substr(5)) : 0;
  const std::map<std::string, DeviceKind> catalog = device_catalog();
  const std::string name = cuda_device_name(device);
  const std::string kind = catalog_kind_of_gpu(catalog, name, cuda_device_memory_bytes(device));
  DeviceKind k;
  try {
    k = kind.empty() ? measured_gpu_kind(device, name, cuda_device_memory_bytes(device)) : catalog.at(kind);
  } catch (const std::exception& e) {
    why = "the device catalog has no kind for this GPU (\"" + name + "\"), and measuring it failed: " + e.what();
    return std::nullopt;
  }
  Config c = config;
  c.cluster.device = k.kind;
  c.cluster.devices_per_node = std::max(1, grid.local_size);
  c.cluster.nodes = std::max(1, grid.world / std::max(1, grid.local_size));
  int64_t memory = k.memory_bytes;
  const int64_t free = cuda_free_memory_bytes(device);
  if (free > 0) memory = std::min(memory, free + static_cast<int64_t>(config.cluster.runtime_mib * (1 << 20)));
  c.cluster.device_memory = std::to_string(memory);
  c.cluster.device_memory_bytes = memory;
  c.cluster.intra_node_gbps = k.intra_node_gbps;
  c.cluster.inter_node_gbps = k.inter_node_gbps;
  if (c.cluster.host_memory.empty()) {  // this machine's, where the config describes none
    c.cluster.host_memory_bytes = host_physical_memory_bytes();
    c.cluster.host_memory = std::to_string(c.cluster.host_memory_bytes);
  }
  // Copies to and from the host at the rate the run's link will take (measured once per GPU;
  // memory.host_link_gbps is CPU ranks' model).
  if (const double link = host_link_rate(device); link > 0) c.memory.host_link_gbps = link;
  return c;
}

}  // namespace ht

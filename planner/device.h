#pragma once
// One kind of device as its vendor publishes it (configs/devices.toml): memory, bandwidths,
// dense peak rates and the links of the nodes it comes in. Plain data: what the planner's
// machine and its per-op time model read.

#include <cstdint>
#include <string>

namespace ht {

struct DeviceKind {
  std::string kind;           // the catalog's key, e.g. "h100-sxm"
  std::string name;           // "NVIDIA H100 SXM5 80GB"
  std::string source;         // where the figures come from
  int64_t memory_bytes = 0;
  double memory_gbps = 0;     // GB/s, 1e9 bytes
  double bf16_tflops = 0, fp16_tflops = 0, fp32_tflops = 0;  // dense peaks
  double intra_node_gbps = 0;  // between devices of a node, each direction
  double inter_node_gbps = 0;  // a device's share of its node's network, each direction
  int devices_per_node = 8;
};

}  // namespace ht

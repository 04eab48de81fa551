#pragma once
// The machine a plan is for: nodes of devices, each rank on its own device (a GPU cluster) or
// ranks sharing a host's cores (CPU ranks, as here), memory per device, and the links between
// them (alpha-beta: latency plus bytes over bandwidth). Plain data.

#include <algorithm>
#include <cstdint>
#include <string>

namespace ht {

struct Machine {
  std::string description;       // one line for the report: where these numbers come from
  int nodes = 1;
  int devices_per_node = 1;      // ranks a node runs (its devices, or its share of cores)
  // CPU ranks: the ranks of a node share its hardware threads; a rank of r on a node of
  // host_threads computes with host_threads / r threads (at least one, several ranks a core), or
  // with rank_threads where the job sets them (training.threads: a rank's, not the host's).
  bool shared_host = true;
  int host_threads = 1;
  int rank_threads = 0;
  int64_t device_memory = 0;     // bytes per rank; 0: unknown (every plan fits)
  // Host memory per rank (0: unknown, not checked), and whether a rank's device memory is that
  // same host memory (CPU ranks): what an async checkpoint's copy is checked against.
  int64_t host_memory = 0;
  bool device_is_host = false;
  // A GPU rank's process holds device memory its tensors cannot use: the CUDA context with the
  // libraries' kernels, handles and workspaces, and each NCCL communicator's buffers (one per
  // group the rank is in: data-parallel, tensor-parallel, pipeline neighbours). 0 on CPU ranks.
  int64_t runtime_bytes = 0;
  int64_t communicator_bytes = 0;
  double intra_node_gbps = 10;   // GB/s between ranks of a node
  double inter_node_gbps = 10;   // GB/s between nodes
  double intra_node_latency_us = 5;
  double inter_node_latency_us = 20;
  // Pipeline stages' messages match in posting order on serial streams, as NCCL carries them (a
  // catalog GPU; CPU ranks under parallel.pipeline_p2p = "nccl_like"): a send waits for its receive,
  // priced by playing the stages' streams (parallel/serial_streams.h). Else matched by tag (MPI).
  bool p2p_in_posting_order = false;
  double device_speed = 1.0;     // compute speed relative to the device profiled here
  double host_link_gbps = 25;    // device <-> host memory, each way (host swap: memory.host_link_gbps)
  // A catalog device's dense peaks, FLOP per ms (model FLOPs utilization); 0: not known.
  double peak_half_flops_per_ms = 0;   // bf16 and fp16
  double peak_float_flops_per_ms = 0;
  int max_ranks() const { return nodes * devices_per_node; }
  // What a rank of a plan with these groups holds outside its tensors.
  int64_t reserved_bytes(bool replicas, bool tensor, bool stages, bool context = false) const {
    return runtime_bytes + communicator_bytes * ((replicas ? 1 : 0) + (tensor ? 1 : 0) + (stages ? 1 : 0) + (context ? 1 : 0));
  }
};

// The link a ring collective over `ranks` ranks, `stride` apart in the job's rank order, runs at:
// bandwidth per rank, GB/s each way, and latency per step. Within a node, the node's link. Across
// nodes, each device's share of the node's network (Machine::inter_node_gbps: a NIC per GPU on
// DGX-class nodes) carries the rings that leave the node through it: NCCL runs a ring per NIC
// (rail-aligned channels), so a group with k ranks on each node crosses the network through k
// NICs at once, k x the device's share, no more than the node's link its rings also cross.
struct RingLink {
  double gbps = 0;
  double latency_us = 0;
};
inline RingLink ring_link(const Machine& m, int ranks, int stride) {
  stride = std::max(1, stride);
  if (static_cast<int64_t>(ranks) * stride <= m.devices_per_node) return {m.intra_node_gbps, m.intra_node_latency_us};
  const int per_node = std::max(1, std::min(ranks, m.devices_per_node / stride));
  return {std::min(m.intra_node_gbps, per_node * m.inter_node_gbps), m.inter_node_latency_us};
}

}  // namespace ht

#pragma once
// The device catalog (configs/devices.toml, built into the binary; a user's file adds kinds or
// replaces them) and the cluster a plan is for, as `hybrid_train plan --cluster KIND:NODESxDEVICES`
// names it.

#include "launcher/config/config_loader.h"
#include "planner/device.h"

#include <map>
#include <string>
#include <vector>

namespace ht {

// Adds a kind this process measured (measured_gpu_kind) to every catalog it reads after.
void add_measured_kind(const DeviceKind& kind);
// A GPU the catalog lacks, measured here (launcher/planning/device_measure.h) and added to the
// catalog as "measured-<its name>", with a line saying what was measured.
DeviceKind measured_gpu_kind(int device, const std::string& name, int64_t memory_bytes);

// The built-in catalog, the kinds measured in this process, then `user_file`'s kinds over them ("": none). UserError naming the file,
// the kind and the key where an entry is malformed (a missing or unknown key, a figure that is
// not a positive number, a memory size that does not parse).
std::map<std::string, DeviceKind> device_catalog(const std::string& user_file = "");
// Parses a catalog's text; `where` names it in errors.
std::map<std::string, DeviceKind> parse_device_catalog(const std::string& text, const std::string& where);

// `kind` of the catalog (the built-in one and `user_file`'s); UserError naming `where` (the key
// or argument that named it) and the kinds there are where it is unknown.
DeviceKind catalog_kind(const std::string& kind, const std::string& user_file, const std::string& where);

struct ClusterOfKind {
  DeviceKind device;
  int nodes = 1;
  int devices_per_node = 8;
  // Not empty where the shape is one the catalog does not describe (more devices in a node than
  // the kind's nodes hold): what it is priced as, and the shape that is likely meant.
  std::string warning;
};
// "h100-sxm:8x8" (8 nodes of 8), "h100-sxm:1x4" (one node of 4). UserError naming --cluster, and
// the kinds there are where the kind is unknown; one number alone ("h100-sxm:8": nodes or
// devices?) is refused with both readings written out.
ClusterOfKind parse_cluster(const std::string& text, const std::map<std::string, DeviceKind>& catalog);
// The catalog's kind of a GPU the driver names `gpu_name` with `memory_bytes` of memory: the kinds
// whose family ("h100" of "h100-sxm") is a word of the name, the PCIe variant where the name says
// PCIe (the others where it does not), then the nearest memory size; "" where no family matches
// (a workstation's card).
std::string catalog_kind_of_gpu(const std::map<std::string, DeviceKind>& catalog, const std::string& gpu_name,
                                int64_t memory_bytes);
// This machine's GPUs as a cluster of one node (`plan` with training.device = "cuda"): their kind
// from the catalog, their count, and each one's memory as the driver has it free now, with
// `runtime_bytes` (what this process's CUDA context holds, which the planner counts apart) added
// back. UserError where no GPU is visible; a GPU the catalog has no kind for is measured
// (measured_gpu_kind).
ClusterOfKind local_gpu_cluster(const std::map<std::string, DeviceKind>& catalog, int64_t runtime_bytes);

// The [cluster] keys that describe `cluster` to the planner, as overrides typed as `argument`:
// nodes, devices per node, memory and links from the catalog (the latencies and device_speed stay
// the config's).
std::vector<ConfigOverride> cluster_overrides(const ClusterOfKind& cluster, const std::string& argument);

}  // namespace ht

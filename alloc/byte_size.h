#pragma once
// Memory sizes as people write them, for budgets and messages.

#include <cstdint>
#include <optional>
#include <string>

namespace ht {

// "1.5GiB", "800MiB", "64KiB" (powers of 1024), "2GB", "500MB", "64KB" (powers of 1000), "4096"
// or "4096B" (bytes), or "60%" of `device_bytes`. Case-insensitive units, spaces allowed before
// the unit. nullopt if malformed, not positive, or a share outside (0, 100].
std::optional<int64_t> parse_byte_size(const std::string& text, int64_t device_bytes);

// "1.50 GiB", "812.3 MiB", "900 B": three significant digits or so, binary units.
std::string format_bytes(int64_t bytes);

// Physical memory of this machine, or less where this process's cgroup limits it (a container's
// memory limit, a Slurm job's): what "60%" of a CPU device means.
int64_t host_physical_memory_bytes();
// Memory the system could give now without swapping (/proc/meminfo's MemAvailable, no more than
// the cgroup's limit less its use): what host swap's default budget is a share of.
int64_t host_available_memory_bytes();

// The memory limit of the cgroup `proc_cgroup` (a /proc/<pid>/cgroup file) names, under the
// cgroup file system at `sys_root` (v2: memory.max and memory.current; v1: the memory
// controller's memory.limit_in_bytes and memory.usage_in_bytes); limit 0 where there is none.
struct CgroupMemory {
  int64_t limit = 0, used = 0;
};
CgroupMemory cgroup_memory(const std::string& proc_cgroup = "/proc/self/cgroup",
                           const std::string& sys_root = "/sys/fs/cgroup");

}  // namespace ht

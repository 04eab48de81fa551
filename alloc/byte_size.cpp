#include "alloc/byte_size.h"

#include <fstream>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace ht {

std::optional<int64_t> parse_byte_size(const std::string& text, int64_t device_bytes) {
  const char* begin = text.c_str();
  char* end = nullptr;
  const double number = std::strtod(begin, &end);
  if (end == begin || !std::isfinite(number) || number <= 0) return std::nullopt;
  std::string unit(end);
  unit.erase(0, unit.find_first_not_of(' '));
  std::transform(unit.begin(), unit.end(), unit.begin(), [](unsigned char c) { return std::tolower(c); });
  double scale = 0;
  if (unit == "%") {
    if (number > 100) return std::nullopt;
    scale = static_cast<double>(device_bytes) / 100.0;
  } else if (unit.empty() || unit == "b") {
    scale = 1;
  } else {
    static const struct {
      const char* name;
      double scale;
    } kUnits[] = {{"kib", 1024.0}, {"mib", 1024.0 * 1024}, {"gib", 1024.0 * 1024 * 1024},
                  {"tib", 1024.0 * 1024 * 1024 * 1024}, {"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12}};
    for (const auto& u : kUnits) {
      if (unit == u.name) scale = u.scale;
    }
    if (scale == 0) return std::nullopt;
  }
  const double bytes = std::floor(number * scale);
  if (bytes < 1 || bytes > 9.0e18) return std::nullopt;
  return static_cast<int64_t>(bytes);
}

std::string format_bytes(int64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (std::fabs(value) >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  char buf[32];
  if (unit == 0) {
    std::snprintf(buf, sizeof(buf), "%lld B", static_cast<long long>(bytes));
  } else {
    std::snprintf(buf, sizeof(buf), std::fabs(value) < 10 ? "%.2f %s" : "%.1f %s", value, kUnits[unit]);
  }
  return buf;
}

namespace {

// A cgroup file's number; 0 where it is missing, or says "max", or is v1's "no limit" (about 2^63).
int64_t cgroup_number(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text.empty() || !std::isdigit(static_cast<unsigned char>(text[0]))) return 0;
  const unsigned long long value = std::strtoull(text.c_str(), nullptr, 10);
  return value >= (1ULL << 62) ? 0 : static_cast<int64_t>(value);
}

}  // namespace

CgroupMemory cgroup_memory(const std::string& proc_cgroup, const std::string& sys_root) {
  std::ifstream in(proc_cgroup);
  for (std::string line; std::getline(in, line);) {
    // "0::/path" (v2), "4:memory:/path" (v1)
    const size_t first = line.find(':'), second = first == std::string::npos ? first : line.find(':', first + 1);
    if (second == std::string::npos) continue;
    const std::string id = line.substr(0, first), controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    const bool v2 = id == "0" && controllers.empty();
    if (!v2 && ("," + controllers + ",").find(",memory,") == std::string::npos) continue;
    const std::string root = v2 ? sys_root : sys_root + "/memory";
    const char* limit = v2 ? "/memory.max" : "/memory.limit_in_bytes";
    const char* usage = v2 ? "/memory.current" : "/memory.usage_in_bytes";
    // The group's own folder; in a container without a cgroup namespace, the path is the host's
    // and the container sees its own group mounted at the root.
    for (const std::string& at : {root + path, root}) {
      if (!std::ifstream(at + limit)) continue;
      CgroupMemory m{cgroup_number(at + limit), cgroup_number(at + usage)};
      if (m.limit > 0) return m;
      break;
    }
  }
  return {};
}

int64_t host_physical_memory_bytes() {
  const int64_t physical = static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<int64_t>(::sysconf(_SC_PAGE_SIZE));
  const CgroupMemory cgroup = cgroup_memory();
  return cgroup.limit > 0 ? std::min(physical, cgroup.limit) : physical;
}

int64_t host_available_memory_bytes() {
  int64_t available = host_physical_memory_bytes() / 2;  // no /proc: assume half is free
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") {
      available = kib * 1024;
      break;
    }
  }
  const CgroupMemory cgroup = cgroup_memory();
  if (cgroup.limit > 0) available = std::min(available, std::max<int64_t>(0, cgroup.limit - cgroup.used));
  return available;
}

}  // namespace ht

// A cgroup's memory limit, read as a container or a Slurm job sets it: v2 and v1, the group's own
// folder or (no cgroup namespace) the root the container sees, and "no limit" in each form.
#include "alloc/byte_size.h"
#include "tests/support/temp_dir.h"

#include <gtest/gtest.h>

#include <filesystem>

namespace ht::test {
namespace {

TEST(CgroupMemory, TheLimitAndUseOfThisProcesssGroupInEitherVersion) {
  TempDir dir;
  namespace fs = std::filesystem;
  const std::string sys = dir.path("sys");
  // v2, the group's own folder.
  fs::create_directories(sys + "/job/step");
  dir.write("sys/job/step/memory.max", "8589934592\n");
  dir.write("sys/job/step/memory.current", "1073741824\n");
  const std::string v2 = dir.write("v2", "0::/job/step\n");
  CgroupMemory m = cgroup_memory(v2, sys);
  EXPECT_EQ(m.limit, int64_t{8} << 30);
  EXPECT_EQ(m.used, int64_t{1} << 30);
  dir.write("sys/job/step/memory.max", "max\n");
  EXPECT_EQ(cgroup_memory(v2, sys).limit, 0) << "\"max\": no limit";

  // v1, the path is the host's and only the root is there (a container without a namespace).
  fs::create_directories(sys + "/memory");
  dir.write("sys/memory/memory.limit_in_bytes", "4294967296\n");
  dir.write("sys/memory/memory.usage_in_bytes", "123\n");
  const std::string v1 = dir.write("v1", "9:name=systemd:/\n4:memory:/process_api/abc\n0::/\n");
  m = cgroup_memory(v1, sys);
  EXPECT_EQ(m.limit, int64_t{4} << 30);
  EXPECT_EQ(m.used, 123);
  dir.write("sys/memory/memory.limit_in_bytes", "9223372036854771712\n");
  EXPECT_EQ(cgroup_memory(v1, sys).limit, 0) << "v1's unlimited";
  EXPECT_EQ(cgroup_memory(dir.path("missing"), sys).limit, 0);
  EXPECT_LE(host_available_memory_bytes(), host_physical_memory_bytes());
}

}  // namespace
}  // namespace ht::test

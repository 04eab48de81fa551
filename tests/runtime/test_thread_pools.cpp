#include "runtime/thread_pools.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <sched.h>

#include <thread>

namespace ht {
namespace {

TEST(ThreadPools, OneCountGovernsAtenAndOpenBlas) {
  const int before = at::get_num_threads();
  for (int threads : {1, 2}) {
    const ThreadPools pools = set_compute_threads(threads);
    EXPECT_EQ(pools.intra_op, threads);
    EXPECT_EQ(at::get_num_threads(), threads);
    EXPECT_GE(pools.inter_op, 1);
    // Debian's libtorch loads OpenBLAS (libopenblas0-pthread): its pool must follow. Another
    // BLAS is reported as such, not silently left spinning.
    if (pools.blas >= 0) {
      EXPECT_EQ(pools.blas, threads);
    } else {
      EXPECT_NE(pools.describe().find("not OpenBLAS"), std::string::npos);
    }
    EXPECT_NE(pools.describe().find(std::to_string(threads)), std::string::npos);
  }
  set_compute_threads(before);
}

TEST(ThreadPools, RanksOnAHostShareItsHardwareThreads) {
  const int hardware = static_cast<int>(std::thread::hardware_concurrency());
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  EXPECT_LE(default_thread_count(1), std::min(hardware, CPU_COUNT(&set)));  // never beyond its CPUs
  EXPECT_GE(default_thread_count(1), 1);
  EXPECT_EQ(default_thread_count(hardware), 1);
  EXPECT_EQ(default_thread_count(4 * hardware), 1);  // never none
  EXPECT_EQ(default_thread_count(0), default_thread_count(1));
}

TEST(ThreadPools, ACpuBindingLimitsTheThreads) {
  cpu_set_t all;
  CPU_ZERO(&all);
  ASSERT_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
  int first = 0;
  while (!CPU_ISSET(first, &all)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);  // as mpirun --bind-to core does
  const int bound = default_thread_count(1);
  // The host of two ranks bound so, each to a core of its own: two cores, not this process's one
  // (issue 64: a rank's plan priced its two ranks as sharing one core, at twice the step).
  const int host_of_two = host_cpus_of_ranks(2), host_of_one = host_cpus_of_ranks(1);
  ASSERT_EQ(sched_setaffinity(0, sizeof(all), &all), 0);
  EXPECT_EQ(bound, 1);
  const int hardware = static_cast<int>(std::thread::hardware_concurrency());
  EXPECT_EQ(host_of_two, std::min(hardware, 2));
  EXPECT_EQ(host_of_one, 1);
}

TEST(ThreadPools, ReadsAContainersCpuQuota) {
  EXPECT_EQ(cpus_from_cgroup_quota("200000 100000"), 2);   // docker --cpus=2
  EXPECT_EQ(cpus_from_cgroup_quota("150000 100000\n"), 2); // 1.5 CPUs: 2 threads, rounded up
  EXPECT_EQ(cpus_from_cgroup_quota("50000 100000"), 1);
  EXPECT_EQ(cpus_from_cgroup_quota("max 100000"), 0);      // no quota
  EXPECT_EQ(cpus_from_cgroup_quota("-1 100000"), 0);       // none, as cgroup v1 says it
  EXPECT_EQ(cpus_from_cgroup_quota(""), 0);
  EXPECT_EQ(cpus_from_cgroup_quota("12ab 100000"), 0);
  EXPECT_EQ(cpus_from_cgroup_quota("100000 0"), 0);
}

}  // namespace
}  // namespace ht

#include "runtime/thread_pools.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

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
  EXPECT_EQ(default_thread_count(1), std::max(1, hardware));
  EXPECT_EQ(default_thread_count(hardware), 1);
  EXPECT_EQ(default_thread_count(4 * hardware), 1);  // never none
  EXPECT_EQ(default_thread_count(0), std::max(1, hardware));
}

}  // namespace
}  // namespace ht

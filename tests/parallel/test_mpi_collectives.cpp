// Run under mpirun with 2 or more ranks (ctest does, tests/CMakeLists.txt): collectives and
// gradient averaging across real MPI ranks. Every rank runs every test; a failure on any rank
// fails the job.
#include "parallel/data_parallel.h"
#include "parallel/process_grid.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace ht {
namespace {

ProcessGrid& grid() {
  static ProcessGrid g = make_process_grid();
  return g;
}

TEST(MpiCollectives, TheJobHasSeveralRanks) {
  ASSERT_TRUE(launched_by_mpi()) << "run this under mpirun";
  EXPECT_GE(grid().world, 2);
  EXPECT_EQ(grid().data_parallel, grid().world);
  EXPECT_EQ(grid().data_parallel_group->backend(), "mpi");
}

TEST(MpiCollectives, AllreduceAndBroadcast) {
  Communicator& c = *grid().data_parallel_group;
  const int n = c.size(), r = c.rank();
  at::Tensor t = at::full({5}, static_cast<float>(r + 1));
  c.allreduce_sum(t, "a test tensor");
  EXPECT_TRUE(t.equal(at::full({5}, static_cast<float>(n * (n + 1) / 2))));
  at::Tensor b = at::full({3}, r == 0 ? 7.0 : -1.0, at::kDouble);
  c.broadcast(b, 0, "a test tensor");
  EXPECT_TRUE(b.equal(at::full({3}, 7.0, at::kDouble)));
  at::Tensor half = at::ones({2}, at::kHalf);
  EXPECT_THROW(c.allreduce_sum(half, "a half tensor"), std::runtime_error) << "says which types work";
}

TEST(MpiCollectives, GradientsAreAveragedAcrossBucketsAndMissingOnes) {
  Communicator& c = *grid().data_parallel_group;
  const int n = c.size(), r = c.rank();
  // A tensor larger than a bucket, many tiny ones, one only rank 0 has a gradient for, one that no
  // rank has: buckets of 64 bytes.
  std::vector<at::Tensor> params{at::zeros({100}), at::zeros({3}), at::zeros({2}), at::zeros({4})};
  for (int i = 0; i < 20; ++i) params.push_back(at::zeros({1}));
  for (auto& p : params) p.requires_grad_(true);
  for (size_t k = 0; k < params.size(); ++k) {
    if (k == 2 && r != 0) continue;  // only rank 0 reached it
    if (k == 3) continue;             // nobody did
    params[k].mutable_grad() = at::full(params[k].sizes(), static_cast<float>((r + 1) * (k + 1)));
  }
  DataParallel dp(grid().data_parallel_group, params, 64);
  EXPECT_EQ(dp.buckets().size(), 3u) << "16 tiny ones; 4 tiny ones with the 4, 2 and 3; the 100 alone";
  dp.average_gradients();
  const float ranks_sum = static_cast<float>(n * (n + 1) / 2);
  for (size_t k = 0; k < params.size(); ++k) {
    if (k == 3) {
      EXPECT_FALSE(params[k].grad().defined()) << "no rank had a gradient";
      continue;
    }
    const float sum = k == 2 ? 1.0f * (k + 1) : ranks_sum * static_cast<float>(k + 1);
    EXPECT_TRUE(at::allclose(params[k].grad(), at::full(params[k].sizes(), sum / static_cast<float>(n))))
        << "parameter " << k;
  }
  EXPECT_GT(dp.stats().comm_bytes, 0);
  EXPECT_DOUBLE_EQ(dp.mean(static_cast<double>(r), "a number"), (n - 1) / 2.0);
}

}  // namespace
}  // namespace ht

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ht::grid();
  const int failed = RUN_ALL_TESTS();
  ht::finalize_process_grid();
  return failed;
}

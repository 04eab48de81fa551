// Run under mpirun with 2 or more ranks (ctest does, tests/CMakeLists.txt): collectives and
// gradient averaging across real MPI ranks. Every rank runs every test; a failure on any rank
// fails the job.
#include "parallel/data_parallel.h"
#include "parallel/grid_group.h"
#include "parallel/process_grid.h"
#include "runtime/interpreter.h"
#include "runtime/ops.h"

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
  at::Tensor bool_tensor = at::ones({2}, at::kBool);
  EXPECT_THROW(c.allreduce_sum(bool_tensor, "a bool tensor"), std::runtime_error) << "says which types work";
  // 16-bit floats (tensor parallelism's activations under autocast): summed in fp32, rounded once.
  // 1 + 2^-8 on every rank is not a bf16 number; n of it, summed in fp32, is rounded once.
  for (const at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    at::Tensor s = at::full({4}, 1.0 + 1.0 / 256 * (r + 1), at::kFloat).to(dtype);
    const at::Tensor wide = s.to(at::kFloat);
    at::Tensor expected = wide.clone();
    c.allreduce_sum(expected, "the fp32 sum");
    c.allreduce_sum(s, "a 16-bit tensor");
    EXPECT_EQ(s.scalar_type(), dtype);
    EXPECT_TRUE(s.equal(expected.to(dtype))) << c10::toString(dtype) << ": " << s << " expected " << expected;
    at::Tensor shard = at::empty({2}, dtype);
    const at::Tensor full = at::full({2 * n}, 1.5, dtype);
    c.reduce_scatter_sum(full, shard, std::vector<int64_t>(static_cast<size_t>(n), 2), "a 16-bit tensor");
    EXPECT_TRUE(shard.equal(at::full({2}, 1.5 * n, dtype))) << c10::toString(dtype) << ": " << shard;
  }
  at::Tensor sent = at::full({3}, r == 0 ? 2.5 : 0.0, at::kBFloat16);
  c.broadcast(sent, 0, "a bf16 tensor");
  EXPECT_TRUE(sent.equal(at::full({3}, 2.5, at::kBFloat16)));
}

// Counts that differ between ranks (rank r has r + 2 elements; rank 0 none where there are 3
// or more: an empty shard) and values that name their rank and position.
std::vector<int64_t> uneven_counts(int n) {
  std::vector<int64_t> counts;
  for (int r = 0; r < n; ++r) counts.push_back(n >= 3 && r == 0 ? 0 : r + 2);
  return counts;
}

TEST(MpiCollectives, ReduceScatterSumsEachRanksPartUnevenCountsToo) {
  Communicator& c = *grid().data_parallel_group;
  const int n = c.size(), r = c.rank();
  for (const std::vector<int64_t>& counts : {std::vector<int64_t>(static_cast<size_t>(n), 3), uneven_counts(n)}) {
    int64_t total = 0, offset = 0;
    for (int k = 0; k < n; ++k) {
      if (k == r) offset = total;
      total += counts[static_cast<size_t>(k)];
    }
    // Rank k contributes (k + 1) x (position + 1): the sum is n(n+1)/2 x (position + 1).
    at::Tensor full = at::arange(1, total + 1, at::kFloat) * static_cast<float>(r + 1);
    at::Tensor shard = at::empty({counts[static_cast<size_t>(r)]}, at::kFloat);
    c.reduce_scatter_sum(full, shard, counts, "a test tensor");
    const at::Tensor expected =
        at::arange(offset + 1, offset + shard.numel() + 1, at::kFloat) * static_cast<float>(n * (n + 1) / 2);
    EXPECT_TRUE(shard.equal(expected)) << "rank " << r << ": " << shard << " expected " << expected;
  }
}

TEST(MpiCollectives, AllGatherPutsEveryShardInPlaceAnyDtype) {
  Communicator& c = *grid().data_parallel_group;
  const int n = c.size(), r = c.rank();
  const std::vector<int64_t> counts = uneven_counts(n);
  int64_t total = 0, offset = 0;
  for (int k = 0; k < n; ++k) {
    if (k == r) offset = total;
    total += counts[static_cast<size_t>(k)];
  }
  const at::Tensor expected = at::arange(total, at::kFloat);
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kLong}) {
    // Out of place: a shard of its own.
    at::Tensor shard = expected.narrow(0, offset, counts[static_cast<size_t>(r)]).to(dtype).contiguous();
    at::Tensor full = at::full({total}, -1, dtype);
    c.all_gather(shard, full, counts, "a test tensor");
    EXPECT_TRUE(full.equal(expected.to(dtype))) << c10::toString(dtype) << ": " << full;
    // In place: the shard is the whole's own slice, the rest is stale.
    at::Tensor whole = at::full({total}, -1, dtype);
    whole.narrow(0, offset, counts[static_cast<size_t>(r)]).copy_(shard);
    at::Tensor own = whole.narrow(0, offset, counts[static_cast<size_t>(r)]);
    c.all_gather(own, whole, counts, "a test tensor");
    EXPECT_TRUE(whole.equal(expected.to(dtype))) << "in place, " << c10::toString(dtype) << ": " << whole;
  }
}

TEST(MpiCollectives, ShardedCollectivesNameWhatIsWrong) {
  Communicator& c = *grid().data_parallel_group;
  at::Tensor full = at::zeros({10}), shard = at::zeros({1});
  try {
    c.reduce_scatter_sum(full, shard, {10}, "the gradients");
    FAIL() << "one count for a group of several";
  } catch (const CommunicationError& e) {
    EXPECT_NE(std::string(e.what()).find("the reduce-scatter of the gradients: 1 counts for a group of"),
              std::string::npos) << e.what();
  }
  std::vector<int64_t> counts(static_cast<size_t>(c.size()), 2);
  try {
    c.all_gather(shard, full, counts, "the parameters");
    FAIL() << "a whole of the wrong size";
  } catch (const CommunicationError& e) {
    EXPECT_NE(std::string(e.what()).find("the whole has 10 elements, the counts sum to"), std::string::npos) << e.what();
  }
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

TEST(MpiCollectives, SendAndReceiveAroundARing) {
  Communicator& c = *grid().data_parallel_group;
  const int n = c.size(), r = c.rank();
  const at::Tensor mine = at::full({4}, static_cast<double>(r), at::kDouble);
  at::Tensor from_left = at::empty({4}, at::kDouble);
  // Even ranks send first, odd ones receive first: no two neighbours both wait to send.
  if (r % 2 == 0) {
    c.send(mine, (r + 1) % n, "a test tensor");
    c.recv(from_left, (r + n - 1) % n, "a test tensor");
  } else {
    c.recv(from_left, (r + n - 1) % n, "a test tensor");
    c.send(mine, (r + 1) % n, "a test tensor");
  }
  EXPECT_TRUE(from_left.equal(at::full({4}, static_cast<double>((r + n - 1) % n), at::kDouble)));
}

// One backward through the interpreter on this rank's data, then the gradients averaged, with the
// buckets started during backward (overlap) or after it. Parameters: w1 used twice (a tied
// weight: two leaf records), w3 only on rank 0, w4 on no rank.
std::vector<at::Tensor> averaged_gradients(bool overlap, DataParallelStats* stats) {
  at::manual_seed(7);
  std::vector<at::Tensor> params{at::randn({16, 16}), at::randn({16}), at::randn({16, 16}), at::randn({16, 16}),
                                 at::randn({16, 16})};
  for (at::Tensor& p : params) p.requires_grad_(true);
  const at::Tensor &w1 = params[0], &b = params[1], &w2 = params[2], &w3 = params[3];
  DataParallel dp(grid().data_parallel_group, params, 1100, overlap);  // about one matrix a bucket
  EXPECT_EQ(dp.overlaps(), overlap);
  GradientBuffer buffer(dp.reduction_order());
  dp.use_gradient_buffer(&buffer);
  Interpreter interp;
  interp.set_gradient_buffer(&buffer);
  const int r = dp.rank();
  at::manual_seed(100 + r);
  Tensor h = relu(linear(interp.input(at::randn({5, 16})), interp.param(w1), interp.param(b)));
  h = linear(h, interp.param(w2));
  if (r == 0) h = linear(h, interp.param(w3));
  h = linear(h, interp.param(w1));
  if (overlap) interp.set_gradient_listener(&dp);
  interp.backward(sum(h));
  interp.set_gradient_listener(nullptr);
  dp.average_gradients();
  *stats = dp.stats();
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : params) grads.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
  return grads;
}

TEST(MpiCollectives, BucketsStartedDuringBackwardAverageAsAfterIt) {
  DataParallelStats after_stats, during_stats;
  const auto after = averaged_gradients(false, &after_stats);
  const auto during = averaged_gradients(true, &during_stats);
  EXPECT_GE(after_stats.comm_ms, 0.0);
  EXPECT_EQ(after_stats.overlap, 0.0);
  EXPECT_GT(during_stats.comm_bytes, 0);
  EXPECT_EQ(during_stats.comm_bytes, after_stats.comm_bytes);
  ASSERT_EQ(after.size(), during.size());
  for (size_t k = 0; k + 1 < after.size(); ++k) {
    ASSERT_TRUE(after[k].defined() && during[k].defined()) << "parameter " << k;
    EXPECT_TRUE(after[k].equal(during[k])) << "parameter " << k << ": the same sums, bit for bit";
  }
  EXPECT_FALSE(after.back().defined() || during.back().defined()) << "w4: no rank had a gradient";
}

// The two groups of a grid of stages as one (a sharded pipeline's checkpoint): world ranks in the
// grid's order, sums and broadcasts over every rank, and what has no meaning across two groups refused.
TEST(MpiCollectives, AGridOfStagesActsAsTheWholeJob) {
  ProcessGrid g = grid();
  divide_process_grid(g, g.world % 2 == 0 && g.world >= 4 ? 2 : g.world);  // 2 x 2 at 4 ranks
  GridGroup world(*g.data_parallel_group, *g.pipeline_group);
  EXPECT_EQ(world.size(), g.world);
  EXPECT_EQ(world.rank(), g.rank);
  at::Tensor seen = at::zeros({g.world}, at::kDouble);
  seen[world.rank()] = world.rank() + 1;
  world.allreduce_sum(seen, "a test table");
  EXPECT_TRUE(seen.equal(at::arange(1, g.world + 1, at::kDouble)));
  at::Tensor b = at::full({2}, g.rank == g.world - 1 ? 5.0 : -1.0, at::kDouble);
  world.broadcast(b, g.world - 1, "a test tensor");
  EXPECT_TRUE(b.equal(at::full({2}, 5.0, at::kDouble)));
  world.barrier("a test barrier");
  at::Tensor full = at::zeros({g.world}), shard = at::zeros({1});
  try {
    world.reduce_scatter_sum(full, shard, std::vector<int64_t>(static_cast<size_t>(g.world), 1), "a test tensor");
    ADD_FAILURE() << "a reduce-scatter over the grid ran";
  } catch (const CommunicationError& e) {
    EXPECT_NE(std::string(e.what()).find("a reduce-scatter of a test tensor over the whole grid"), std::string::npos)
        << e.what();
  }
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

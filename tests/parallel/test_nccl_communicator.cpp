// NcclCommunicator (parallel/nccl_communicator.h), in builds that have NCCL. Without a GPU (CI):
// setting it up fails with an error that names the rank, the device and what it saw, and leaves
// nothing behind. With one (the GPU machine): a group of one sets up through its bootstrap and
// carries host tensors through its device buffer, every collective an identity.
#include "parallel/collective_worker.h"
#include "parallel/communicator.h"

#include <gtest/gtest.h>

#ifdef HT_HAVE_NCCL
#include "parallel/nccl_communicator.h"
#include "parallel/stream_collectives.h"
#include "parallel/parameter_shards.h"
#include "runtime/memory_hooks.h"

#include <ATen/ATen.h>

namespace ht {
namespace {

TEST(NcclCommunicator, WithoutAGpuSettingUpSaysWhatItSaw) {
  if (visible_cuda_devices() > 0) GTEST_SKIP() << "a GPU is here: NcclCommunicator.AGroupOfOne runs instead";
  LocalCommunicator bootstrap;
  bootstrap.set_context("step 3");
  try {
    NcclCommunicator nccl(bootstrap, 0, 5);
    FAIL() << "set up NCCL without a GPU";
  } catch (const CommunicationError& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find("rank 5, step 3"), std::string::npos) << text;
    EXPECT_NE(text.find("cuda:0"), std::string::npos) << text;
    EXPECT_NE(text.find("0 devices visible"), std::string::npos) << text;
  }
}

TEST(NcclCommunicator, AGroupOfOne) {
  if (visible_cuda_devices() == 0) GTEST_SKIP() << "no GPU here";
  LocalCommunicator bootstrap;
  NcclCommunicator nccl(bootstrap, 0, 0);
  EXPECT_EQ(nccl.size(), 1);
  EXPECT_EQ(nccl.backend(), "nccl");
  at::Tensor flags = at::tensor({1.0f, 0.0f, 2.5f});  // host memory, as DataParallel's flags
  nccl.allreduce_sum(flags, "the flags");
  EXPECT_TRUE(at::equal(flags, at::tensor({1.0f, 0.0f, 2.5f})));
  at::Tensor loss = at::tensor({0.75}, at::kDouble);
  nccl.broadcast(loss, 0, "the loss");
  EXPECT_EQ(loss.item<double>(), 0.75);
  nccl.barrier("the end");
  at::Tensor strided = at::ones({4, 4}).t();
  EXPECT_THROW(nccl.allreduce_sum(strided, "a transposed tensor"), CommunicationError);
  at::Tensor activation = at::ones({2});
  EXPECT_THROW(nccl.isend(activation, 0, 1, "an activation"), CommunicationError);
}

// NCCL's own reduce-scatter and all-gather with one rank: its part is the whole, the sum is itself.
// The padded path for uneven counts needs several ranks, so several GPUs (docs/gpu.md).
TEST(NcclCommunicator, AGroupOfOneReduceScattersAndGathers) {
  if (visible_cuda_devices() == 0) GTEST_SKIP() << "no GPU here";
  LocalCommunicator bootstrap;
  NcclCommunicator nccl(bootstrap, 0, 0);
  const auto cuda = at::TensorOptions().device(at::kCUDA, 0);
  at::Tensor full = at::arange(7, cuda.dtype(at::kFloat));
  at::Tensor shard = at::zeros({7}, cuda.dtype(at::kFloat));
  nccl.reduce_scatter_sum(full, shard, {7}, "the gradients");
  EXPECT_TRUE(at::equal(shard.cpu(), at::arange(7, at::kFloat)));
  at::Tensor gathered = at::zeros({7}, cuda.dtype(at::kBFloat16));
  nccl.all_gather(shard.to(at::kBFloat16), gathered, {7}, "the parameters");
  EXPECT_TRUE(at::equal(gathered.cpu(), at::arange(7, at::kBFloat16)));
  at::Tensor host = at::zeros({7}), host_shard = at::zeros({7});
  try {
    nccl.all_gather(host_shard, host, {7}, "host parameters");
    FAIL() << "gathered into host memory";
  } catch (const CommunicationError& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
  }
}


// The replicas' communicator runs its collectives on a communication stream of its own (issue 67):
// each waits for the kernels queued before it on the caller's stream, and what the caller queues
// after the call (the copy to the host) waits for it; the host does not. A long chain of kernels
// writes the input just before the call.
TEST(NcclCommunicator, AGroupOfOneOnItsOwnStreamWaitsForTheKernelsBeforeIt) {
  if (visible_cuda_devices() == 0) GTEST_SKIP() << "no GPU here";
  LocalCommunicator bootstrap;
  NcclCommunicator nccl(bootstrap, 0, 0, /*side_stream=*/true);
  const auto cuda = at::TensorOptions().device(at::kCUDA, 0);
  at::Tensor x = at::zeros({1 << 20}, cuda);
  for (int i = 0; i < 200; ++i) x.add_(1);  // queued on the compute stream, not yet run
  nccl.allreduce_sum(x, "the gradients");
  EXPECT_TRUE(at::equal(x.cpu(), at::full({1 << 20}, 200.0f))) << "the sum of the written values";
  at::Tensor full = at::zeros({8}, cuda), shard = at::zeros({8}, cuda);
  for (int i = 0; i < 50; ++i) full.add_(2);
  nccl.reduce_scatter_sum(full, shard, {8}, "the gradients");
  EXPECT_TRUE(at::equal(shard.cpu(), at::full({8}, 100.0f)));
}

// The replicas' queue on a GPU (parallel/stream_collectives.h): jobs queued on the communication
// stream from this thread, behind the kernels before them; the compute stream waits for them on
// events, and the watchdog sees them done.
TEST(NcclCommunicator, AGroupOfOnesQueueRunsOnTheCommunicationStream) {
  if (visible_cuda_devices() == 0) GTEST_SKIP() << "no GPU here";
  LocalCommunicator bootstrap;
  auto nccl = std::make_shared<NcclCommunicator>(bootstrap, 0, 0, /*side_stream=*/true);
  std::shared_ptr<CollectiveQueue> queue = make_collective_queue(nccl);
#ifdef HT_TORCH_CUDA
  ASSERT_NE(dynamic_cast<StreamCollectives*>(queue.get()), nullptr);
#endif
  const auto cuda = at::TensorOptions().device(at::kCUDA, 0);
  at::Tensor x = at::zeros({1 << 20}, cuda);
  for (int i = 0; i < 200; ++i) x.add_(1);
  queue->allreduce(x, 0.5, "the gradients");
  at::Tensor full = at::full({9}, 3.0f, cuda), shard = at::zeros({9}, cuda);
  const uint64_t ticket =
      queue->submit([full, shard](Communicator& c) mutable { c.reduce_scatter_sum(full, shard, {9}, "the gradients"); });
  queue->wait_for(ticket);
  EXPECT_TRUE(at::equal(shard.cpu(), at::full({9}, 3.0f)));
  queue->wait();
  EXPECT_TRUE(at::equal(x.cpu(), at::full({1 << 20}, 100.0f))) << "summed over one rank, halved, after the writes";
  EXPECT_NO_THROW(nccl->rethrow_async_failure());
}

// ZeRO-3's mechanism on CUDA (parallel/parameter_shards.h): each bucket's CUDA storage taken away
// and given back, NCCL's all-gather writing into it, on the computing thread and then prefetched on
// the communication thread. Several ranks need several GPUs; the mechanism is the same.
TEST(NcclCommunicator, AGroupOfOneGathersParameterBucketsOnCuda) {
  if (visible_cuda_devices() == 0) GTEST_SKIP() << "no GPU here";
  LocalCommunicator bootstrap;
  auto nccl = std::make_shared<NcclCommunicator>(bootstrap, 0, 0);
  const auto cuda = at::TensorOptions().device(at::kCUDA, 0);
  std::vector<at::Tensor> params{at::randn({4, 3}, cuda), at::randn({5}, cuda), at::randn({2, 2}, cuda)};
  std::vector<at::Tensor> original;
  for (const at::Tensor& p : params) original.push_back(p.cpu());
  auto resident = [](const at::Tensor& t) { return t.storage().data() != nullptr; };
  auto same = [&](size_t k) { return at::equal(params[k].cpu(), original[k]); };
  MemoryHooks memory;
  ParameterShards shards(nccl, params, {{2}, {1, 0}}, at::Device(at::kCUDA, 0));
  shards.set_block_uses({{params[0], params[1]}, {params[2]}});
  for (const at::Tensor& p : params) EXPECT_FALSE(resident(p)) << "freed once sharded";
  shards.before_read(params[1], memory, 1);
  EXPECT_TRUE(resident(params[0]) && same(0) && same(1)) << "the whole bucket, gathered by NCCL";
  EXPECT_FALSE(resident(params[2]));
  shards.release_all();
  EXPECT_FALSE(resident(params[0]));

  shards.set_prefetch(std::make_shared<CollectiveWorker>(nccl), 1);
  ASSERT_TRUE(shards.prefetches());
  shards.block_begins(0);
  shards.before_read(params[2], memory, 2);
  EXPECT_TRUE(same(2)) << "gathered on the communication thread";
  shards.before_read(params[0], memory, 3);
  EXPECT_TRUE(same(0) && same(1));
  shards.block_begins(1);
  EXPECT_FALSE(resident(params[0])) << "no later block reads the first bucket";
  shards.release_all();
  for (const at::Tensor& p : params) EXPECT_FALSE(resident(p));
  EXPECT_EQ(shards.take_stats().gathers, 3);
}

}  // namespace
}  // namespace ht

#else

TEST(NcclCommunicator, NotInThisBuild) { GTEST_SKIP() << "built without NCCL (parallel/CMakeLists.txt)"; }

#endif

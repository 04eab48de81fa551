// OptimizerShard (training/optimizer_shard.h) within one process: pieces are views of
// the parameters in memory order, stepping them is stepping the parameters, and the state goes
// out to the unsharded layout and back. Across ranks: tests/launcher/test_sharding_job.cpp.
#include "training/compact.h"
#include "training/optimizer.h"
#include "training/optimizer_shard.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

namespace ht {
namespace {

TEST(MemoryOrder, IsTheStorageOrderChannelsLastToo) {
  const at::Tensor w = at::arange(2 * 3 * 4 * 5, at::kFloat).view({2, 3, 4, 5}).contiguous(at::MemoryFormat::ChannelsLast);
  const at::Tensor flat = memory_order(w);
  ASSERT_EQ(flat.numel(), w.numel());
  EXPECT_EQ(flat.data_ptr(), w.data_ptr()) << "a view, not a copy";
  for (int64_t i = 0; i < flat.numel(); ++i) EXPECT_EQ(flat[i].item<float>(), w.data_ptr<float>()[i]);
  const at::Tensor back = from_memory_order(flat.clone(), w);
  EXPECT_TRUE(back.equal(w));
  EXPECT_EQ(back.strides(), w.strides()) << "laid out like the parameter";
}

// Two parameters in one block, as the trainer places them (one of them channels-last).
struct TwoTensors {
  std::vector<at::Tensor> params;
  TwoTensors() {
    at::manual_seed(3);
    std::vector<at::Tensor> made = {at::randn({4, 3, 2, 2}).contiguous(at::MemoryFormat::ChannelsLast), at::randn({7})};
    const std::vector<at::Tensor> placed = into_one_block(made, at::kCPU);
    for (const at::Tensor& p : placed) params.push_back(p.detach().requires_grad_(true));
  }
  void set_grads(int step) {
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].mutable_grad() = at::full_like(params[i], 0.1 * static_cast<double>(step + 1)) +
                                 at::arange(params[i].numel(), at::kFloat).view_as(params[i]) * 0.01;
    }
  }
};

TEST(OptimizerShard, AGroupOfOneStepsThePiecesAsTheWholeAndKeepsItsState) {
  TwoTensors sharded, whole;
  GradientBuffer gradients(sharded.params);
  auto group = std::make_shared<LocalCommunicator>();
  OptimizerShard shard(group, sharded.params, {{0, 1}}, &gradients);
  ASSERT_EQ(shard.pieces().size(), 2u) << "one piece per parameter when one rank owns all";
  EXPECT_EQ(shard.elements(), 48 + 7);
  OptimizerOptions t;
  t.kind = OptimizerKind::kAdamw;
  t.weight_decay = 0.1;
  auto opt = make_optimizer(t, shard.pieces());
  auto reference = make_optimizer(t, whole.params);
  for (int step = 0; step < 3; ++step) {
    whole.set_grads(step);
    reference->step();
    // The sharded side's gradients live in the gradient block, as DataParallel leaves them.
    sharded.set_grads(step);
    for (at::Tensor& p : sharded.params) p.mutable_grad() = gradients.slot(p).copy_(p.grad());
    shard.attach_gradients();
    opt->step();
    shard.detach_gradients();
    shard.gather_parameters();
  }
  for (size_t i = 0; i < whole.params.size(); ++i) EXPECT_TRUE(sharded.params[i].equal(whole.params[i])) << i;
  // From the unsharded layout (a whole checkpoint's): a fresh shard takes the reference's state,
  // and has the state the sharded optimizer stepped into, bit for bit.
  auto full = make_optimizer(t, sharded.params);
  for (size_t i = 0; i < whole.params.size(); ++i) {
    set_optimizer_state(*full, sharded.params[i], optimizer_state(*reference, whole.params[i]));
  }
  auto taken = make_optimizer(t, shard.pieces());
  shard.take_state(*full, *taken);
  for (size_t i = 0; i < shard.pieces().size(); ++i) {
    const auto a = optimizer_state(*opt, shard.pieces()[i]), b = optimizer_state(*taken, shard.pieces()[i]);
    ASSERT_EQ(a.size(), b.size());
    ASSERT_FALSE(a.empty());
    for (size_t k = 0; k < a.size(); ++k) EXPECT_TRUE(a[k].equal(b[k])) << "piece " << i << " state " << k;
  }
}

}  // namespace
}  // namespace ht

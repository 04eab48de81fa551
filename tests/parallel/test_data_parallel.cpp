// Data parallelism's pieces in one process: how parameters fall into buckets, and that a group
// of one changes nothing.
#include "parallel/data_parallel.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace ht {
namespace {

std::vector<at::Tensor> params_of(std::vector<int64_t> numels) {
  std::vector<at::Tensor> params;
  for (int64_t n : numels) params.push_back(at::zeros({n}).requires_grad_(true));
  return params;
}

TEST(DataParallel, BucketsInReverseOrderUpToTheirSize) {
  // 4-byte floats; buckets of 400 bytes (100 floats).
  const auto params = params_of({10, 30, 500, 40, 50, 20});
  DataParallel dp(std::make_shared<LocalCommunicator>(), params, 400);
  const std::vector<std::vector<size_t>> expected{{5, 4}, {3}, {2}, {1, 0}};
  EXPECT_EQ(dp.buckets(), expected) << "the 500-float tensor alone; 20+50 fit, 40 would not";
}

TEST(DataParallel, ManyTinyTensorsShareABucket) {
  const auto params = params_of(std::vector<int64_t>(1000, 1));
  DataParallel dp(std::make_shared<LocalCommunicator>(), params, 25 << 20);
  ASSERT_EQ(dp.buckets().size(), 1u);
  EXPECT_EQ(dp.buckets()[0].size(), 1000u);
  EXPECT_EQ(dp.buckets()[0].front(), 999u);
}

TEST(DataParallel, AGroupOfOneLeavesGradientsAlone) {
  auto params = params_of({3, 2});
  params[0].mutable_grad() = at::tensor({1.0f, 2.0f, 3.0f});
  DataParallel dp(std::make_shared<LocalCommunicator>(), params, 400);
  dp.average_gradients();
  EXPECT_TRUE(params[0].grad().equal(at::tensor({1.0f, 2.0f, 3.0f})));
  EXPECT_FALSE(params[1].grad().defined());
  EXPECT_EQ(dp.mean(2.5, "x"), 2.5);
}

TEST(DataParallel, EachBucketIsOneSpanOfAGradientBufferInReductionOrder) {
  auto params = params_of({10, 30, 500, 40, 50, 20});
  params.push_back(at::zeros({7}));  // needs no gradient: in no bucket
  DataParallel dp(std::make_shared<LocalCommunicator>(), params, 400);
  const std::vector<at::Tensor> order = dp.reduction_order();
  ASSERT_EQ(order.size(), 6u);
  EXPECT_TRUE(order.front().is_same(params[5]));
  GradientBuffer buffer(order);
  for (const std::vector<size_t>& bucket : dp.buckets()) {
    std::vector<at::Tensor> members;
    int64_t numel = 0;
    for (size_t k : bucket) {
      members.push_back(params[k]);
      numel += params[k].numel();
    }
    const at::Tensor span = buffer.span(members);
    ASSERT_TRUE(span.defined());
    EXPECT_EQ(span.numel(), numel);
    EXPECT_EQ(span.data_ptr(), buffer.slot(members.front()).data_ptr());
  }
  EXPECT_FALSE(buffer.span({params[0], params[1]}).defined()) << "laid out as 1, 0: not one after another";
  EXPECT_FALSE(buffer.span({params[6]}).defined()) << "no slot";
}

}  // namespace
}  // namespace ht

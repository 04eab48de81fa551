// The host link: bytes arrive unchanged each way, copies in one direction run in order, a copy
// never finishes sooner than the configured rate allows, and its accounting is exact. No
// assertion here depends on how fast the machine is: only lower bounds on time.
#include "alloc/host_link.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>

namespace ht {
namespace {

at::Tensor random_bytes(int64_t n) { return at::randint(0, 256, {n}, at::TensorOptions().dtype(at::kByte)); }

TEST(HostLink, CopiesEveryByteEachWay) {
  ModelledHostLink link(100);
  const at::Tensor device = at::randn({3, 5, 7}).transpose(0, 2);  // strided: the whole storage crosses
  const auto bytes = static_cast<int64_t>(device.storage().nbytes());
  const at::Tensor host = at::empty({bytes}, at::kByte);
  auto out = link.copy(CopyDirection::kToHost, device, host);
  out->wait();
  EXPECT_TRUE(out->done());
  const at::Tensor back = at::empty({bytes}, at::kByte);
  link.copy(CopyDirection::kToDevice, host, back)->wait();
  const at::Tensor rebuilt = at::empty({0}).set_(back.storage(), 0, device.sizes(), device.strides());
  EXPECT_TRUE(rebuilt.equal(device));
  EXPECT_EQ(link.stats(CopyDirection::kToHost).bytes, bytes);
  EXPECT_EQ(link.stats(CopyDirection::kToDevice).bytes, bytes);
  EXPECT_EQ(link.stats(CopyDirection::kToHost).copies, 1);
}

// memory.compress = "bf16": fp32 crosses as bf16, each way, and the link carries bf16's bytes.
TEST(HostLink, ConvertsToTheNarrowerTypeAndCountsItsBytes) {
  ModelledHostLink link(100);
  const at::Tensor device = at::randn({1000});
  const at::Tensor host = at::empty({1000}, at::kBFloat16);
  link.convert(CopyDirection::kToHost, device, host)->wait();
  EXPECT_TRUE(host.equal(device.to(at::kBFloat16)));
  const at::Tensor back = at::empty({1000});
  link.convert(CopyDirection::kToDevice, host, back)->wait();
  EXPECT_TRUE(back.equal(device.to(at::kBFloat16).to(at::kFloat)));
  EXPECT_EQ(link.stats(CopyDirection::kToHost).bytes, 2000);
  EXPECT_EQ(link.stats(CopyDirection::kToDevice).bytes, 2000);
  EXPECT_THROW(link.convert(CopyDirection::kToHost, device, at::empty({999}, at::kBFloat16)), c10::Error);
}

TEST(HostLink, NeverFasterThanTheConfiguredRate) {
  constexpr double kGbps = 0.5;  // 0.5 MB per ms
  ModelledHostLink link(kGbps);
  const int64_t n = 2 << 20;
  const at::Tensor src = random_bytes(n);
  std::vector<at::Tensor> dsts;
  std::vector<std::shared_ptr<CopyJob>> jobs;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 3; ++i) {
    dsts.push_back(at::empty({n}, at::kByte));
    jobs.push_back(link.copy(CopyDirection::kToHost, src, dsts.back()));
  }
  // Queued in order, one at a time: each starts when the one before has finished.
  for (auto& j : jobs) j->wait();
  const double elapsed = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(elapsed, 3 * link.transfer_ms(n) * 0.999);
  for (size_t i = 1; i < jobs.size(); ++i) {
    const double apart = std::chrono::duration<double, std::milli>(jobs[i]->started() - jobs[i - 1]->started()).count();
    EXPECT_GE(apart, link.transfer_ms(n) * 0.999) << "copy " << i << " started before the one before it finished";
  }
  for (const auto& j : jobs) {
    const double ms = std::chrono::duration<double, std::milli>(j->finished() - j->started()).count();
    EXPECT_GE(ms, link.transfer_ms(n) * 0.999);
  }
  const LinkStats s = link.stats(CopyDirection::kToHost);
  EXPECT_EQ(s.copies, 3);
  EXPECT_EQ(s.bytes, 3 * n);
  EXPECT_GE(s.busy_ms, 3 * link.transfer_ms(n) * 0.999);
  for (const at::Tensor& d : dsts) EXPECT_TRUE(d.equal(src));
  EXPECT_EQ(link.stats(CopyDirection::kToDevice).copies, 0) << "the other direction is its own queue";
}

TEST(HostLink, BacklogCountsWhatIsQueued) {
  ModelledHostLink link(0.1);  // 4 MiB: about 42 ms
  const int64_t n = 4 << 20;
  const at::Tensor src = random_bytes(n), dst = at::empty({n}, at::kByte);
  EXPECT_EQ(link.backlog_ms(CopyDirection::kToHost), 0);
  auto job = link.copy(CopyDirection::kToHost, src, dst);
  const double backlog = link.backlog_ms(CopyDirection::kToHost);
  EXPECT_LE(backlog, link.transfer_ms(n) + 1e-6);
  // Read before the copy's modelled end, the backlog still held it.
  if (std::chrono::steady_clock::now() < job->finished()) {
    EXPECT_GT(backlog, 0);
  }
  EXPECT_EQ(link.backlog_ms(CopyDirection::kToDevice), 0);
  job->wait();
  EXPECT_EQ(link.backlog_ms(CopyDirection::kToHost), 0);
  EXPECT_EQ(job->wait(), 0) << "waiting on a finished copy returns at once";
}

TEST(HostLink, RefusesADestinationTooSmall) {
  ModelledHostLink link(10);
  const at::Tensor src = random_bytes(100);
  EXPECT_THROW(link.copy(CopyDirection::kToHost, src, at::empty({99}, at::kByte)), c10::Error);
  EXPECT_THROW(link.copy(CopyDirection::kToHost, src, at::empty({200}, at::kByte).narrow(0, 1, 150)), c10::Error);
}

TEST(HostLink, DestroyedWithCopiesQueuedFinishesThem) {
  const int64_t n = 1 << 20;
  const at::Tensor src = random_bytes(n), dst = at::empty({n}, at::kByte);
  std::shared_ptr<CopyJob> job;
  {
    ModelledHostLink link(1);
    job = link.copy(CopyDirection::kToDevice, src, dst);
  }
  EXPECT_TRUE(job->done());
  EXPECT_TRUE(dst.equal(src));
}

}  // namespace
}  // namespace ht

#include "parallel/stream_collectives.h"

#include "parallel/collective_worker.h"
#include "parallel/communicator.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

namespace ht {
namespace {

// An event that passes when the test says, or when the host waits for it.
class TestFence final : public Fence {
 public:
  explicit TestFence(int id) : id(id) {}
  bool passed() override { return reached; }
  void wait() override {
    ++host_waits;
    reached = true;
  }
  const int id;
  bool reached = false;
  int host_waits = 0;
};

// A communication stream whose events pass when the test says: what the queue asked of it.
class TestStream final : public SideStream {
 public:
  void follow_compute() override { log.push_back("follow"); }
  std::shared_ptr<void> enter() override {
    ++inside;
    log.push_back("enter");
    return std::shared_ptr<void>(nullptr, [this](void*) {
      --inside;
      log.push_back("leave");
    });
  }
  std::shared_ptr<Fence> record() override {
    fences.push_back(std::make_shared<TestFence>(static_cast<int>(fences.size()) + 1));
    log.push_back("record " + std::to_string(fences.back()->id));
    return fences.back();
  }
  void compute_waits(Fence& fence) override {
    log.push_back("compute waits " + std::to_string(static_cast<TestFence&>(fence).id));
  }
  int inside = 0;
  std::vector<std::string> log;
  std::vector<std::shared_ptr<TestFence>> fences;
};

// A group of one with a communication stream, whose watchdog may have failed.
class StreamGroup final : public LocalCommunicator {
 public:
  explicit StreamGroup(std::shared_ptr<SideStream> stream) : stream_(std::move(stream)) {}
  std::shared_ptr<SideStream> side_stream() const override { return stream_; }
  void rethrow_async_failure() override {
    if (!failure.empty()) throw CommunicationError(failure);
  }
  std::string failure;

 private:
  std::shared_ptr<SideStream> stream_;
};

TEST(StreamCollectives, QueuesEachJobOnTheStreamAndTheComputeStreamWaitsNotTheHost) {
  auto stream = std::make_shared<TestStream>();
  auto group = std::make_shared<StreamGroup>(stream);
  StreamCollectives queue(group, stream);
  int ran_inside = 0;
  const uint64_t first = queue.submit([&](Communicator&) { ran_inside += stream->inside; });
  const uint64_t second = queue.submit([&](Communicator&) { ran_inside += stream->inside; });
  EXPECT_EQ(ran_inside, 2);  // each job ran on the host at once, with the stream current
  EXPECT_EQ(queue.wait_for(first), 0);
  EXPECT_EQ(queue.wait(), 0);
  EXPECT_EQ(stream->log, std::vector<std::string>({"follow", "enter", "leave", "record 1", "follow", "enter", "leave",
                                                   "record 2", "compute waits 1", "compute waits 2"}));
  (void)second;
  for (const auto& fence : stream->fences) EXPECT_EQ(fence->host_waits, 0);
}

// A job's tensors stay alive until its event has passed, whoever else lets go of them: the arena
// must not give their blocks to the compute stream while the collective uses them.
TEST(StreamCollectives, HoldsAJobsTensorsUntilItsEventHasPassed) {
  auto stream = std::make_shared<TestStream>();
  auto group = std::make_shared<StreamGroup>(stream);
  auto queue = std::make_unique<StreamCollectives>(group, stream);
  auto sentinel = std::make_shared<int>(0);
  std::weak_ptr<int> alive = sentinel;
  at::Tensor gradients = at::ones({8});
  queue->allreduce(gradients, 0.5, "the gradients");
  queue->submit([held = std::move(sentinel)](Communicator&) {});
  EXPECT_TRUE(at::allclose(gradients, at::full({8}, 0.5)));  // summed over one rank, scaled
  EXPECT_GT(gradients.use_count(), 1u);  // the job holds it too
  gradients = at::Tensor();
  queue->wait();
  EXPECT_FALSE(alive.expired());  // waited for by the compute stream, but not yet done
  EXPECT_EQ(queue->held(), 2u);
  stream->fences[0]->reached = true;
  queue->wait();
  EXPECT_EQ(queue->held(), 1u);
  EXPECT_FALSE(alive.expired());
  // Going away with a job under way: the host waits for it before its tensors go.
  queue.reset();
  EXPECT_TRUE(alive.expired());
  EXPECT_EQ(stream->fences[1]->host_waits, 1);
}

TEST(StreamCollectives, AFailureTheWatchdogFoundShowsAtTheNextWait) {
  auto stream = std::make_shared<TestStream>();
  auto group = std::make_shared<StreamGroup>(stream);
  StreamCollectives queue(group, stream);
  const uint64_t ticket = queue.submit([](Communicator&) {});
  group->failure = "rank 1, step 7: the all-reduce of the gradients (NCCL, cuda:0) not done after 300 s";
  try {
    queue.wait_for(ticket);
    FAIL() << "the watchdog's failure was not thrown";
  } catch (const CommunicationError& e) {
    EXPECT_NE(std::string(e.what()).find("step 7: the all-reduce of the gradients"), std::string::npos);
  }
  stream->fences[0]->reached = true;
}

TEST(StreamCollectives, EachGroupGetsTheQueueItsCommunicatorAllows) {
  auto stream = std::make_shared<TestStream>();
  EXPECT_NE(dynamic_cast<StreamCollectives*>(make_collective_queue(std::make_shared<StreamGroup>(stream)).get()),
            nullptr);
  EXPECT_NE(dynamic_cast<CollectiveWorker*>(make_collective_queue(std::make_shared<LocalCommunicator>()).get()),
            nullptr);
}

}  // namespace
}  // namespace ht

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

// A job's tensors stay alive until the compute stream has been made to wait for the job (or its
// event has passed), whoever else lets go of them: the arena must not give their blocks to the
// compute stream while the collective may still use them.
TEST(StreamCollectives, HoldsAJobsTensorsUntilTheComputeStreamWaitsForIt) {
  auto stream = std::make_shared<TestStream>();
  auto group = std::make_shared<StreamGroup>(stream);
  auto queue = std::make_unique<StreamCollectives>(group, stream);
  auto first = std::make_shared<int>(1), second = std::make_shared<int>(2), third = std::make_shared<int>(3);
  std::weak_ptr<int> first_alive = first, second_alive = second, third_alive = third;
  at::Tensor gradients = at::ones({8});
  queue->allreduce(gradients, 0.5, "the gradients");
  EXPECT_TRUE(at::allclose(gradients, at::full({8}, 0.5)));  // summed over one rank, scaled
  EXPECT_GT(gradients.use_count(), 1u);                       // the job holds it too
  const uint64_t one = queue->submit([held = std::move(first)](Communicator&) {});
  queue->submit([held = std::move(second)](Communicator&) {});
  const uint64_t three = queue->submit([held = std::move(third)](Communicator&) {});
  EXPECT_EQ(queue->held(), 4u);
  // Waited for up to the second job: it and the ones before let go; the compute stream is behind them.
  queue->wait_for(one);
  EXPECT_TRUE(first_alive.expired());
  EXPECT_EQ(gradients.use_count(), 1u);
  EXPECT_FALSE(second_alive.expired());
  EXPECT_EQ(queue->held(), 2u);
  // A job whose event has passed lets go at the next call, waited for or not.
  stream->fences[2]->reached = true;  // the second job's
  stream->fences[0]->reached = stream->fences[1]->reached = true;
  queue->submit([](Communicator&) {});
  EXPECT_TRUE(second_alive.expired());
  EXPECT_FALSE(third_alive.expired());
  // Going away with jobs not waited for: the host waits for them before their tensors go.
  queue.reset();
  EXPECT_TRUE(third_alive.expired());
  EXPECT_EQ(stream->fences[3]->host_waits, 1);
  (void)three;
}

// A rank failing for another reason does not wait for collectives its peers may never match: the
// jobs' tensors stay allocated and its error goes up at once.
TEST(StreamCollectives, GoingAwayWhileAnExceptionUnwindsWaitsForNothing) {
  auto stream = std::make_shared<TestStream>();
  auto group = std::make_shared<StreamGroup>(stream);
  auto sentinel = std::make_shared<int>(0);
  std::weak_ptr<int> alive = sentinel;
  try {
    StreamCollectives queue(group, stream);
    queue.submit([held = std::move(sentinel)](Communicator&) {});
    throw std::runtime_error("a kernel failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(stream->fences[0]->host_waits, 0);
  EXPECT_FALSE(alive.expired());  // kept: the process is ending
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

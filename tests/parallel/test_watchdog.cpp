#include "parallel/watchdog.h"

#include "parallel/communicator.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>

namespace ht {
namespace {

// What the backend's side saw: aborts, and an asynchronous error the test sets.
struct TestBackend {
  std::atomic<int> aborts{0};
  std::atomic<bool> broken{false};
  Watchdog::Backend hooks() {
    return {[this] { return broken.load() ? std::string("unhandled system error") : std::string(); },
            [this] { ++aborts; }, nullptr};
  }
};

TEST(Watchdog, LetsCompletedCallsGoAndThrowsNothing) {
  TestBackend backend;
  Watchdog dog(/*timeout_s=*/600, backend.hooks(), /*grace_s=*/0);
  auto done = std::make_shared<std::atomic<bool>>(false);
  dog.watch("rank 0, step 1: the all-reduce of the gradients", [done] { return done->load(); });
  dog.watch("rank 0, step 1: the all-reduce of the gradient flags", [] { return true; });
  done->store(true);  // the stream gets there
  dog.wait_all();
  EXPECT_EQ(dog.in_flight(), 0u);
  EXPECT_FALSE(dog.failed());
  EXPECT_NO_THROW(dog.rethrow());
  EXPECT_EQ(backend.aborts.load(), 0);
}

// A call that never completes (its peer died): past the timeout the backend is aborted, and the
// owner's next call throws an error naming the rank, the step and the collective.
TEST(Watchdog, AbortsACallPastItsTimeoutAndNamesIt) {
  TestBackend backend;
  Watchdog dog(/*timeout_s=*/0.01, backend.hooks(), /*grace_s=*/0);
  dog.watch("rank 3, step 12: the reduce-scatter of the gradients (NCCL, cuda:0)", [] { return false; });
  try {
    dog.wait_all();
    FAIL() << "a call that never completes was not reported";
  } catch (const CommunicationError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("rank 3, step 12: the reduce-scatter of the gradients"), std::string::npos) << message;
    EXPECT_NE(message.find("parallel.timeout_s"), std::string::npos) << message;
  }
  EXPECT_EQ(backend.aborts.load(), 1);
  EXPECT_TRUE(dog.failed());
  EXPECT_THROW(dog.rethrow(), CommunicationError);  // it stays: every later call throws it
}

TEST(Watchdog, ReportsTheBackendsAsynchronousError) {
  TestBackend backend;
  Watchdog dog(/*timeout_s=*/600, backend.hooks(), /*grace_s=*/0);
  dog.watch("rank 1, step 4: a group of sends and receives (sending the activation of micro-batch 2)",
            [] { return false; });
  backend.broken = true;
  try {
    dog.wait_all();
    FAIL() << "the backend's error was not reported";
  } catch (const CommunicationError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("micro-batch 2"), std::string::npos) << message;
    EXPECT_NE(message.find("unhandled system error"), std::string::npos) << message;
  }
  EXPECT_EQ(backend.aborts.load(), 1);
}

}  // namespace
}  // namespace ht

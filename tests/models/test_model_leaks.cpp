// After backward and a parameter update no activation storage stays alive: no interpreter
// record, no resident byte, and ATen's CPU allocations back to the same level every step.
#include "alloc/cpu_device_allocator.h"
#include "memory/memory_manager.h"
#include "tests/support/model_cases.h"

#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

namespace ht::test {
namespace {

class ModelLeaks : public ::testing::TestWithParam<std::string> {};

TEST_P(ModelLeaks, NothingSurvivesAStep) {
  CpuAllocationCounter& counter = CpuAllocationCounter::install();
  const ModelCase& c = model_case(GetParam());
  at::manual_seed(0);
  std::shared_ptr<Model> model = c.make();
  // Plain SGD keeps no state, so every step must end at exactly the starting level.
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.05));
  MemoryManager memory;
  Interpreter interp{{}, &memory};
  at::manual_seed(1);
  auto [x, y] = c.data(4);
  const int64_t bytes_before = counter.current_bytes();
  for (int step = 0; step < 3; ++step) {
    {
      Tensor loss = model->loss(model->forward(interp.input(x)), interp.input(y));
      interp.backward(loss);
    }
    sgd.step();
    clear_grads(*model);
    EXPECT_EQ(interp.tape().size(), 0u);
    EXPECT_EQ(interp.live_records(), 0) << "records alive after step " << step;
    EXPECT_EQ(memory.stats().resident_bytes, 0);
    EXPECT_EQ(counter.current_bytes(), bytes_before) << "bytes still allocated after step " << step;
  }
}

INSTANTIATE_TEST_SUITE_P(AllModels, ModelLeaks,
                         ::testing::Values("mlp", "convnet", "resnet18", "resnet50_imagenet_stem",
                                           "gpt", "llama", "supernet"));

}  // namespace
}  // namespace ht::test

// The contract DTR relies on: drop the data of every non-leaf tensor after forward, run backward
// (which regenerates what it reads) and training stays bit-identical: losses, parameters and
// batch-norm running statistics, dropout masks included, over several optimizer steps.
#include "tests/support/model_cases.h"
#include "memory/memory_manager.h"
#include "tests/support/op_check.h"

#include <torch/optim/sgd.h>

namespace ht::test {
namespace {

struct Trajectory {
  std::vector<at::Tensor> losses;
  std::vector<at::Tensor> state;  // parameters then buffers after the last step
  int64_t recomputations = 0;
};

Trajectory train(const ModelCase& c, bool drop_after_forward) {
  constexpr uint64_t kSeed = 4;
  at::manual_seed(kSeed);
  std::shared_ptr<Model> model = c.make();
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  MemoryManager memory;
  Interpreter interp(InterpreterOptions{ExecutionMode::kInterpreted, kSeed}, &memory);
  Trajectory out;
  for (int step = 0; step < 3; ++step) {
    at::manual_seed(100 + step);
    auto [x, y] = c.data(4);
    Tensor loss = model->loss(model->forward(interp.input(x)), interp.input(y));
    if (drop_after_forward) {
      memory.evict_all();
      EXPECT_EQ(memory.stats().resident_bytes, 0) << "every activation dropped";
    }
    interp.backward(loss);
    out.losses.push_back(loss.value().clone());
    sgd.step();
    clear_grads(*model);
  }
  for (const at::Tensor& p : model->parameters()) out.state.push_back(p.detach().clone());
  for (const at::Tensor& b : model->buffers()) out.state.push_back(b.clone());
  out.recomputations = memory.stats().recomputations;
  return out;
}

class ModelRegeneration : public ::testing::TestWithParam<std::string> {};

TEST_P(ModelRegeneration, DroppingEverythingIsBitIdentical) {
  const ModelCase& c = model_case(GetParam());
  const Trajectory plain = train(c, false);
  const Trajectory dropped = train(c, true);
  EXPECT_EQ(plain.recomputations, 0);
  EXPECT_GT(dropped.recomputations, 0);
  for (size_t i = 0; i < plain.losses.size(); ++i)
    EXPECT_TRUE(plain.losses[i].equal(dropped.losses[i])) << "loss at step " << i;
  ASSERT_EQ(plain.state.size(), dropped.state.size());
  for (size_t i = 0; i < plain.state.size(); ++i)
    EXPECT_TRUE(plain.state[i].equal(dropped.state[i])) << "parameter/buffer " << i;
}

INSTANTIATE_TEST_SUITE_P(AllModels, ModelRegeneration,
                         ::testing::Values("mlp", "convnet", "resnet18", "resnet50_imagenet_stem",
                                           "gpt", "llama", "supernet"));

}  // namespace
}  // namespace ht::test

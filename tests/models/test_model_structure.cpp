// Model structure: parameter counts of the standard architectures, blocks, tied weights,
// the supernet's changing graph, and bad options.
#include "models/resnet.h"
#include "models/supernet.h"
#include "tests/support/model_cases.h"

#include <gtest/gtest.h>

#include <set>

namespace ht::test {
namespace {

TEST(ModelStructure, ResNetParameterCountsMatchThePaperArchitectures) {
  // torchvision's counts for 1000 classes with the ImageNet stem.
  EXPECT_EQ(ResNet(ResNetOptions{18, 64, {}, 3, 1000, false}).num_parameters(), 11689512);
  EXPECT_EQ(ResNet(ResNetOptions{34, 64, {}, 3, 1000, false}).num_parameters(), 21797672);
  EXPECT_EQ(ResNet(ResNetOptions{50, 64, {}, 3, 1000, false}).num_parameters(), 25557032);
}

TEST(ModelStructure, ResNetBlocksAreStemResidualBlocksAndHead) {
  ResNet r18(ResNetOptions{18, 8, {}, 3, 10, true});
  EXPECT_EQ(r18.blocks().size(), 1u + 8u + 1u);
  EXPECT_THROW(ResNet(ResNetOptions{20, 8, {}, 3, 10, true}), c10::Error);
}

TEST(ModelStructure, SupernetGraphChangesAcrossSteps) {
  const ModelCase& c = model_case("supernet");
  auto model = c.make();
  auto* supernet = dynamic_cast<Supernet*>(model.get());
  ASSERT_NE(supernet, nullptr);
  Interpreter interp(InterpreterOptions{ExecutionMode::kInterpreted, 1});
  at::manual_seed(0);
  auto [x, y] = c.data(2);
  std::set<std::vector<int64_t>> seen;
  for (int step = 0; step < 8; ++step) {
    NoGradGuard no_grad(interp);
    model->forward(interp.input(x));
    seen.insert(supernet->last_choices());
  }
  EXPECT_GT(seen.size(), 4u) << "paths drawn per step should vary";
}

TEST(ModelStructure, EvaluationModeGivesDeterministicOutput) {
  for (const ModelCase& c : small_model_cases()) {
    if (c.name == "supernet") continue;  // its path is drawn per call by design
    SCOPED_TRACE(c.name);
    auto model = c.make();
    model->eval();
    Interpreter interp;
    at::manual_seed(0);
    auto [x, y] = c.data(3);
    NoGradGuard no_grad(interp);
    const at::Tensor a = model->forward(interp.input(x)).value().clone();
    const at::Tensor b = model->forward(interp.input(x)).value().clone();
    EXPECT_TRUE(a.equal(b));
    EXPECT_EQ(interp.tape().size(), 0u);
  }
}

}  // namespace
}  // namespace ht::test

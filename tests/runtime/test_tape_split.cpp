// What pipeline stages ask of the tape: one tape per micro-batch's forward, backwards run later in
// any order of micro-batches, and backward split into the inputs' and the weights' parts
// (zero-bubble schedules). Each must give the bits of the plain forward-then-backward.
#include "tests/support/model_cases.h"
#include "tests/support/op_check.h"

namespace ht::test {
namespace {

std::vector<at::Tensor> grads_of(Model& model) {
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : model.parameters()) grads.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
  return grads;
}

void expect_bit_equal(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].defined(), b[i].defined()) << what << ": parameter " << i;
    if (a[i].defined()) {
      EXPECT_TRUE(at::equal(a[i], b[i])) << what << ": parameter " << i;
    }
  }
}

// Two micro-batches, run as one rank runs them: forward, backward, forward, backward.
std::vector<at::Tensor> sequential(Model& model, const std::vector<std::pair<at::Tensor, at::Tensor>>& micro) {
  clear_grads(model);
  Interpreter interp(InterpreterOptions{ExecutionMode::kInterpreted, 7});
  for (const auto& [x, y] : micro) {
    Tensor loss = model.loss(model.forward(interp.input(x)), interp.input(y));
    interp.backward(loss);
  }
  return grads_of(model);
}

// Both forwards first (each tape taken), then the backwards in micro-batch order, each whole or
// in two parts with the weights' parts deferred past the next micro-batch's inputs' part.
std::vector<at::Tensor> pipelined(Model& model, const std::vector<std::pair<at::Tensor, at::Tensor>>& micro,
                                  bool split) {
  clear_grads(model);
  Interpreter interp(InterpreterOptions{ExecutionMode::kInterpreted, 7});
  std::vector<Tape> tapes;
  std::vector<Tensor> losses;
  for (const auto& [x, y] : micro) {
    losses.push_back(model.loss(model.forward(interp.input(x)), interp.input(y)));
    tapes.push_back(interp.take_tape());
    EXPECT_TRUE(interp.tape().size() == 0u);
  }
  for (size_t k = 0; k < micro.size(); ++k) {
    const at::Tensor one = at::ones(losses[k].sizes(), losses[k].value().options());
    interp.backward(tapes[k], {losses[k]}, {one}, split ? BackwardPart::kInputs : BackwardPart::kAll);
    if (split && k > 0) interp.backward(tapes[k - 1], {}, {}, BackwardPart::kWeights);
  }
  if (split) interp.backward(tapes.back(), {}, {}, BackwardPart::kWeights);
  for (const Tape& t : tapes) EXPECT_TRUE(t.empty());
  return grads_of(model);
}

class TapeSplit : public ::testing::TestWithParam<std::string> {};

TEST_P(TapeSplit, MicroBatchTapesAndTwoPartBackwardGiveTheSameBits) {
  const ModelCase& c = model_case(GetParam());
  at::manual_seed(11);
  std::shared_ptr<Model> model = c.make();
  model->train();
  std::vector<std::pair<at::Tensor, at::Tensor>> micro = {c.data(3), c.data(3)};
  // Batch norm's running statistics change with each forward: restore them before each run.
  std::vector<at::Tensor> buffers;
  for (const at::Tensor& b : model->buffers()) buffers.push_back(b.clone());
  auto restore = [&] {
    std::vector<at::Tensor> now = model->buffers();
    for (size_t i = 0; i < now.size(); ++i) now[i].copy_(buffers[i]);
  };
  const std::vector<at::Tensor> reference = sequential(*model, micro);
  restore();
  expect_bit_equal(pipelined(*model, micro, /*split=*/false), reference, "taken tapes");
  restore();
  expect_bit_equal(pipelined(*model, micro, /*split=*/true), reference, "inputs' then weights' parts");
}

INSTANTIATE_TEST_SUITE_P(Models, TapeSplit, ::testing::Values("mlp", "convnet", "resnet18", "gpt", "llama"),
                         [](const auto& info) { return info.param; });

TEST(TapeSplit, TheInputsPartGivesTheStageInputItsGradientAndNoWeightOne) {
  Interpreter interp;
  at::Tensor w = at::randn({4, 4}).requires_grad_(true);
  Tensor x = interp.stage_input(at::randn({2, 4}));
  Tensor y = sum(relu(linear(x, interp.param(w))));
  Tape tape = interp.take_tape();
  interp.backward(tape, {y}, {at::ones({})}, BackwardPart::kInputs);
  EXPECT_TRUE(x.value().grad().defined()) << "the gradient the previous stage waits for";
  EXPECT_FALSE(w.grad().defined()) << "deferred to the weights' part";
  EXPECT_FALSE(tape.empty()) << "the linear's weight gradient is still owed";
  interp.backward(tape, {}, {}, BackwardPart::kWeights);
  EXPECT_TRUE(w.grad().defined());
  EXPECT_TRUE(tape.empty());
}

}  // namespace
}  // namespace ht::test

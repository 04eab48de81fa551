// Every model: loss, every parameter gradient and every buffer (batch-norm running statistics)
// equal libtorch autograd run on the same forward, for several seeds and batch sizes (float64).
#include "tests/support/model_cases.h"
#include "tests/support/op_check.h"

namespace ht::test {
namespace {

at::Tensor train_step(Model& model, ExecutionMode mode, uint64_t seed, const at::Tensor& x,
                      const at::Tensor& y) {
  Interpreter interp(InterpreterOptions{mode, seed});
  model.train();
  Tensor loss = model.loss(model.forward(interp.input(x)), interp.input(y));
  interp.backward(loss);
  return loss.value().detach().clone();
}

class ModelGradients : public ::testing::TestWithParam<std::string> {};

TEST_P(ModelGradients, EqualLibtorchAutograd) {
  const ModelCase& c = model_case(GetParam());
  for (const at::Device& device : test_devices()) {
    for (uint64_t seed : {1, 2, 3}) {
      for (int64_t batch : {2, 5}) {
        SCOPED_TRACE(::testing::Message() << device << " seed " << seed << " batch " << batch);
        at::manual_seed(seed + 100);
        auto [x, y] = c.data(batch);
        x = x.is_floating_point() ? x.to(device, at::kDouble) : x.to(device);
        y = y.to(device);
        at::manual_seed(seed);
        std::shared_ptr<Model> ours = c.make();
        at::manual_seed(seed);
        std::shared_ptr<Model> reference = c.make();
        ours->move_to(device, at::kDouble);
        reference->move_to(device, at::kDouble);

        const at::Tensor loss = train_step(*ours, ExecutionMode::kInterpreted, seed, x, y);
        const at::Tensor ref_loss = train_step(*reference, ExecutionMode::kAutograd, seed, x, y);
        EXPECT_TRUE(all_close(loss, ref_loss)) << "loss";

        auto params = ours->named_parameters();
        auto ref_params = reference->named_parameters();
        for (const auto& item : params) {
          EXPECT_TRUE(all_close(item.value().grad(), ref_params[item.key()].grad()))
              << "gradient of " << item.key();
        }
        auto ref_buffers = reference->named_buffers();
        for (const auto& item : ours->named_buffers()) {
          EXPECT_TRUE(all_close(item.value(), ref_buffers[item.key()], 0, 0)) << "buffer " << item.key();
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllModels, ModelGradients,
                         ::testing::Values("mlp", "convnet", "resnet18", "resnet50_imagenet_stem",
                                           "gpt", "llama", "supernet"));

}  // namespace
}  // namespace ht::test

#include "tests/support/model_cases.h"

#include "models/convnet.h"
#include "models/decoder.h"
#include "models/mlp.h"
#include "models/resnet.h"
#include "models/supernet.h"

namespace ht::test {
namespace {

std::function<std::pair<at::Tensor, at::Tensor>(int64_t)> images(int64_t c, int64_t size,
                                                                  int64_t classes) {
  return [=](int64_t b) {
    return std::make_pair(at::randn({b, c, size, size}), at::randint(classes, {b}, at::kLong));
  };
}

}  // namespace

std::vector<ModelCase> small_model_cases() {
  std::vector<ModelCase> cases;
  cases.push_back({"mlp", [] { return std::make_shared<Mlp>(MlpOptions{64, {32, 16}, 5, 0.2}); },
                   images(1, 8, 5)});
  cases.push_back({"convnet",
                   [] { return std::make_shared<ConvNet>(ConvNetOptions{1, 8, {4, 6}, 16, 5, 0.25}); },
                   images(1, 8, 5)});
  cases.push_back({"resnet18",
                   [] { return std::make_shared<ResNet>(ResNetOptions{18, 4, {}, 3, 5, true}); },
                   images(3, 8, 5)});
  cases.push_back({"resnet50_imagenet_stem",
                   [] {
                     return std::make_shared<ResNet>(ResNetOptions{50, 2, {1, 1, 1, 1}, 3, 5, false});
                   },
                   images(3, 16, 5)});
  cases.push_back({"gpt",
                   [] { return std::make_shared<Decoder>(DecoderOptions::gpt2(17, 8, 2, 2, 16, 0.1)); },
                   [](int64_t b) {
                     return std::make_pair(at::randint(17, {b, 8}, at::kLong),
                                           at::randint(17, {b, 8}, at::kLong));
                   }});
  // Grouped-query attention (4 heads, 2 key/value heads), rotary positions, untied head.
  cases.push_back({"llama",
                   [] { return std::make_shared<Decoder>(DecoderOptions::llama(19, 8, 2, 4, 2, 16)); },
                   [](int64_t b) {
                     return std::make_pair(at::randint(19, {b, 8}, at::kLong),
                                           at::randint(19, {b, 8}, at::kLong));
                   }});
  cases.push_back({"supernet",
                   [] { return std::make_shared<Supernet>(SupernetOptions{3, 8, 6, 3, 5}); },
                   images(3, 8, 5)});
  return cases;
}

const ModelCase& model_case(const std::string& name) {
  static const std::vector<ModelCase> cases = small_model_cases();
  for (const ModelCase& c : cases)
    if (c.name == name) return c;
  throw std::invalid_argument("no model case named " + name);
}

void clear_grads(torch::nn::Module& module) {
  for (at::Tensor& p : module.parameters()) p.mutable_grad() = at::Tensor();
}

}  // namespace ht::test

#pragma once
// Small configurations of every model in models/, with matching random data, for tests.

#include "models/model.h"

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ht::test {

struct ModelCase {
  std::string name;
  std::function<std::shared_ptr<Model>()> make;
  // (input, target) for a batch of the given size, drawn from ATen's global generator.
  std::function<std::pair<at::Tensor, at::Tensor>(int64_t batch)> data;
};

std::vector<ModelCase> small_model_cases();
const ModelCase& model_case(const std::string& name);

// Sets every parameter gradient to undefined (libtorch 1.13's zero_grad() zeroes in place).
void clear_grads(torch::nn::Module& module);

}  // namespace ht::test

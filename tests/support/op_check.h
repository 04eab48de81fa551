#pragma once
// Test support: compare one op (or a small composition) run through our interpreter against
// libtorch autograd on the same inputs, outputs and every input gradient.

#include "runtime/interpreter.h"
#include "runtime/ops.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

namespace ht::test {

// CPU always; CUDA when this build's libtorch has it and a GPU is present.
std::vector<at::Device> test_devices();

// max |a - b| <= atol + rtol * max |b|, with a readable failure message.
::testing::AssertionResult all_close(const at::Tensor& actual, const at::Tensor& expected,
                                     double rtol = 1e-9, double atol = 1e-12);

using OurFn = std::function<std::vector<Tensor>(Interpreter&, std::vector<Tensor>&)>;
using RefFn = std::function<std::vector<at::Tensor>(std::vector<at::Tensor>&)>;

struct OpCheck {
  std::vector<at::Tensor> inputs;    // floating inputs get gradients; others are constants
  OurFn ours;                         // the op(s) under test, on interpreter handles
  RefFn reference;                    // the same computation with ATen + autograd
  std::vector<bool> output_has_grad;  // per output: feed an upstream gradient (default: all)
  double rtol = 1e-9;
  double atol = 1e-12;
  uint64_t seed = 7;                  // interpreter seed (random ops)
};

// Runs the check on the given device (inputs are moved there), reporting with EXPECT_*.
void check_op(const OpCheck& check, const at::Device& device);
// Runs it on every test device.
void check_op(const OpCheck& check);

inline std::vector<Tensor> one(Tensor t) { return {std::move(t)}; }
inline std::vector<at::Tensor> one(at::Tensor t) { return {std::move(t)}; }

// A random double tensor: the op checks' inputs.
inline at::Tensor rnd(std::vector<int64_t> sizes) { return at::randn(sizes, at::kDouble); }

}  // namespace ht::test

#include "tests/support/op_check.h"

#include <torch/csrc/autograd/autograd.h>

namespace ht::test {

std::vector<at::Device> test_devices() {
  std::vector<at::Device> devices{at::kCPU};
  if (at::hasCUDA()) devices.emplace_back(at::kCUDA, 0);
  return devices;
}

::testing::AssertionResult all_close(const at::Tensor& actual, const at::Tensor& expected,
                                     double rtol, double atol) {
  if (!actual.defined() || !expected.defined()) {
    if (actual.defined() == expected.defined()) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << (actual.defined() ? "expected is undefined" : "actual is undefined");
  }
  if (actual.sizes() != expected.sizes()) {
    return ::testing::AssertionFailure()
           << "shape " << actual.sizes() << " != expected " << expected.sizes();
  }
  if (actual.numel() == 0) return ::testing::AssertionSuccess();
  const at::Tensor a = actual.detach().to(at::kCPU, at::kDouble);
  const at::Tensor e = expected.detach().to(at::kCPU, at::kDouble);
  const double diff = (a - e).abs().max().item<double>();
  const double scale = e.abs().max().item<double>();
  if (diff <= atol + rtol * scale) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max |diff| " << diff << " > " << atol << " + " << rtol
                                       << " * " << scale;
}

void check_op(const OpCheck& check, const at::Device& device) {
  SCOPED_TRACE("device " + device.str());
  // Reference: ATen with autograd.
  std::vector<at::Tensor> ref_inputs, ref_grad_inputs;
  for (const at::Tensor& in : check.inputs) {
    at::Tensor t = in.to(device).clone();
    if (t.is_floating_point()) {
      t.requires_grad_(true);
      ref_grad_inputs.push_back(t);
    }
    ref_inputs.push_back(t);
  }
  std::vector<at::Tensor> ref_outputs = check.reference(ref_inputs);
  std::vector<at::Tensor> upstream, graded_ref_outputs;
  at::manual_seed(check.seed + 1);
  for (size_t j = 0; j < ref_outputs.size(); ++j) {
    const bool has_grad = check.output_has_grad.empty() || check.output_has_grad[j];
    upstream.push_back(has_grad ? at::randn(ref_outputs[j].sizes(), ref_outputs[j].options())
                                : at::Tensor());
    if (has_grad) graded_ref_outputs.push_back(ref_outputs[j]);
  }
  std::vector<at::Tensor> defined_upstream;
  for (const at::Tensor& u : upstream)
    if (u.defined()) defined_upstream.push_back(u);
  const std::vector<at::Tensor> ref_grads = torch::autograd::grad(
      graded_ref_outputs, ref_grad_inputs, defined_upstream, /*retain_graph=*/false,
      /*create_graph=*/false, /*allow_unused=*/true);

  // Ours: the interpreter, tape and backward.
  Interpreter interp(InterpreterOptions{ExecutionMode::kInterpreted, check.seed});
  std::vector<at::Tensor> our_grad_inputs;
  std::vector<Tensor> handles;
  for (const at::Tensor& in : check.inputs) {
    at::Tensor t = in.to(device).clone();
    if (t.is_floating_point()) {
      t.requires_grad_(true);
      our_grad_inputs.push_back(t);
      handles.push_back(interp.param(t));
    } else {
      handles.push_back(interp.input(t));
    }
  }
  std::vector<Tensor> outputs = check.ours(interp, handles);
  ASSERT_EQ(outputs.size(), ref_outputs.size()) << "number of outputs";
  std::vector<Tensor> roots;
  std::vector<at::Tensor> root_grads;
  for (size_t j = 0; j < outputs.size(); ++j) {
    EXPECT_TRUE(all_close(outputs[j].value(), ref_outputs[j], check.rtol, check.atol))
        << "output " << j;
    if (upstream[j].defined()) {
      roots.push_back(outputs[j]);
      root_grads.push_back(upstream[j]);
    }
  }
  interp.backward(roots, root_grads);
  EXPECT_EQ(interp.tape().size(), 0u) << "backward must consume the tape";
  for (size_t i = 0; i < our_grad_inputs.size(); ++i) {
    const at::Tensor& expected = ref_grads[i];
    const at::Tensor& actual = our_grad_inputs[i].grad();
    if (!expected.defined()) {
      // autograd found no path; ours must not invent a gradient other than zeros
      EXPECT_TRUE(!actual.defined() || actual.abs().max().item<double>() == 0.0)
          << "input " << i << ": unexpected gradient";
      continue;
    }
    EXPECT_TRUE(all_close(actual, expected, check.rtol, check.atol)) << "gradient of input " << i;
  }
}

void check_op(const OpCheck& check) {
  for (const at::Device& device : test_devices()) check_op(check, device);
}

}  // namespace ht::test

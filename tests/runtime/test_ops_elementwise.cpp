// Elementwise ops: forward and gradients equal libtorch autograd (float64).
#include "tests/support/op_check.h"

namespace ht::test {
namespace {

TEST(OpsElementwise, BinaryWithBroadcasting) {
  at::manual_seed(0);
  struct Case {
    std::vector<int64_t> a, b;
  };
  for (const Case& c : {Case{{3, 4}, {3, 4}}, Case{{2, 3, 4}, {4}}, Case{{2, 1, 4}, {3, 1}}}) {
    SCOPED_TRACE(::testing::Message() << "shapes " << at::IntArrayRef(c.a) << " "
                                      << at::IntArrayRef(c.b));
    const at::Tensor a = rnd(c.a), b = rnd(c.b).abs() + 0.5;  // b away from 0 for div
    check_op({{a, b}, [](auto&, auto& x) { return one(add(x[0], x[1])); },
              [](auto& x) { return one(x[0] + x[1]); }});
    check_op({{a, b}, [](auto&, auto& x) { return one(sub(x[0], x[1])); },
              [](auto& x) { return one(x[0] - x[1]); }});
    check_op({{a, b}, [](auto&, auto& x) { return one(mul(x[0], x[1])); },
              [](auto& x) { return one(x[0] * x[1]); }});
    check_op({{a, b}, [](auto&, auto& x) { return one(div(x[0], x[1])); },
              [](auto& x) { return one(x[0] / x[1]); }});
  }
}

TEST(OpsElementwise, SameTensorTwice) {
  at::manual_seed(1);
  check_op({{rnd({5})}, [](auto&, auto& x) { return one(mul(x[0], x[0])); },
            [](auto& x) { return one(x[0] * x[0]); }});
  check_op({{rnd({5})}, [](auto&, auto& x) { return one(add(x[0], x[0])); },
            [](auto& x) { return one(x[0] + x[0]); }});
}

TEST(OpsElementwise, ScalarForms) {
  at::manual_seed(2);
  const at::Tensor x = rnd({3, 5});
  check_op({{x}, [](auto&, auto& t) { return one(add(t[0], 2.5)); },
            [](auto& t) { return one(t[0] + 2.5); }});
  check_op({{x}, [](auto&, auto& t) { return one(mul(t[0], -1.5)); },
            [](auto& t) { return one(t[0] * -1.5); }});
  check_op({{x}, [](auto&, auto& t) { return one(div(t[0], 3.0)); },
            [](auto& t) { return one(t[0] / 3.0); }});
}

TEST(OpsElementwise, Activations) {
  at::manual_seed(3);
  const at::Tensor x = rnd({4, 6});
  check_op({{x}, [](auto&, auto& t) { return one(relu(t[0])); },
            [](auto& t) { return one(at::relu(t[0])); }});
  check_op({{x}, [](auto&, auto& t) { return one(gelu(t[0])); },
            [](auto& t) { return one(at::gelu(t[0])); }});
  check_op({{x}, [](auto&, auto& t) { return one(gelu(t[0], true)); },
            [](auto& t) { return one(at::gelu(t[0], "tanh")); }});
  check_op({{x}, [](auto&, auto& t) { return one(tanh(t[0])); },
            [](auto& t) { return one(at::tanh(t[0])); }});
  check_op({{x}, [](auto&, auto& t) { return one(sigmoid(t[0])); },
            [](auto& t) { return one(at::sigmoid(t[0])); }});
  check_op({{x}, [](auto&, auto& t) { return one(silu(t[0])); },
            [](auto& t) { return one(at::silu(t[0])); }});
}

TEST(OpsElementwise, SwigluIsSiluOfTheFirstHalfTimesTheSecond) {
  at::manual_seed(5);
  check_op({{rnd({2, 3, 8})}, [](auto&, auto& t) { return one(swiglu(t[0])); },
            [](auto& t) { return one(at::silu(t[0].narrow(-1, 0, 4)) * t[0].narrow(-1, 4, 4)); }});
}

// The one op gives the bits of the three it replaced (split, silu, mul), forward and backward, in
// bf16 as in fp32: a Llama trains as before, saving silu's output no longer.
TEST(OpsElementwise, SwigluHasTheBitsOfSplitSiluAndMul) {
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    at::manual_seed(6);
    const at::Tensor x = at::randn({3, 5, 16}).to(dtype), g = at::randn({3, 5, 8}).to(dtype);
    std::vector<at::Tensor> outs, grads;
    for (const bool fused : {true, false}) {
      Interpreter interp;
      const at::Tensor leaf = x.clone().requires_grad_(true);
      const Tensor in = interp.param(leaf);
      Tensor y;
      if (fused) {
        y = swiglu(in);
      } else {
        const std::vector<Tensor> halves = split(in, 8, 2);
        y = mul(silu(halves[0]), halves[1]);
      }
      outs.push_back(y.value().clone());
      interp.backward({y}, {g});
      grads.push_back(leaf.grad().clone());
    }
    EXPECT_TRUE(outs[0].equal(outs[1])) << dtype;
    EXPECT_TRUE(grads[0].equal(grads[1])) << dtype;
  }
}

TEST(OpsElementwise, MaskedFill) {
  at::manual_seed(4);
  const at::Tensor x = rnd({2, 4, 4});
  const at::Tensor mask = at::ones({4, 4}, at::kBool).triu(1);
  check_op({{x, mask}, [](auto&, auto& t) { return one(masked_fill(t[0], t[1], -7.0)); },
            [](auto& t) { return one(t[0].masked_fill(t[1], -7.0)); }});
}

TEST(OpsElementwise, MaskedFillRejectsNonBoolMask) {
  Interpreter interp;
  Tensor x = interp.input(at::zeros({2}));
  Tensor m = interp.input(at::zeros({2}));
  EXPECT_THROW(masked_fill(x, m, 1.0), c10::Error);
}

}  // namespace
}  // namespace ht::test

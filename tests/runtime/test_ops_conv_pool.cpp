// conv2d and pooling: forward and gradients equal libtorch autograd (float64).
#include "tests/support/op_check.h"

namespace ht::test {
namespace {

TEST(OpsConvPool, Conv2dStridePaddingGroups) {
  at::manual_seed(0);
  struct Case {
    int64_t stride, padding, dilation, groups;
    bool bias;
  };
  for (const Case& c : {Case{1, 1, 1, 1, true}, Case{2, 0, 1, 1, false}, Case{1, 2, 2, 1, true},
                        Case{2, 1, 1, 2, true}, Case{1, 1, 1, 4, false}}) {
    SCOPED_TRACE(::testing::Message() << "stride " << c.stride << " padding " << c.padding
                                      << " dilation " << c.dilation << " groups " << c.groups);
    const at::Tensor x = rnd({2, 4, 7, 6}), w = rnd({4, 4 / c.groups, 3, 3}), b = rnd({4});
    Conv2dArgs args{{c.stride, c.stride}, {c.padding, c.padding}, {c.dilation, c.dilation},
                    c.groups};
    std::vector<at::Tensor> inputs{x, w};
    if (c.bias) inputs.push_back(b);
    check_op({inputs,
              [args](auto&, auto& t) {
                return one(conv2d(t[0], t[1], t.size() > 2 ? t[2] : Tensor(), args));
              },
              [args](auto& t) {
                return one(at::conv2d(t[0], t[1], t.size() > 2 ? t[2] : at::Tensor(), args.stride,
                                      args.padding, args.dilation, args.groups));
              },
              {}, 1e-9, 1e-10});
  }
}

TEST(OpsConvPool, MaxPool2d) {
  at::manual_seed(1);
  const at::Tensor x = rnd({2, 3, 7, 8});
  check_op({{x}, [](auto&, auto& t) { return one(max_pool2d(t[0], {2, 2})); },
            [](auto& t) { return one(at::max_pool2d(t[0], {2, 2})); }});
  check_op({{x}, [](auto&, auto& t) { return one(max_pool2d(t[0], {3, 3}, {2, 2}, {1, 1}, true)); },
            [](auto& t) { return one(at::max_pool2d(t[0], {3, 3}, {2, 2}, {1, 1}, {1, 1}, true)); }});
}

TEST(OpsConvPool, AvgPool2d) {
  at::manual_seed(2);
  const at::Tensor x = rnd({2, 3, 6, 6});
  check_op({{x}, [](auto&, auto& t) { return one(avg_pool2d(t[0], {2, 2})); },
            [](auto& t) { return one(at::avg_pool2d(t[0], {2, 2})); }});
  check_op({{x},
            [](auto&, auto& t) { return one(avg_pool2d(t[0], {3, 3}, {2, 2}, {1, 1}, false, false)); },
            [](auto& t) { return one(at::avg_pool2d(t[0], {3, 3}, {2, 2}, {1, 1}, false, false)); }});
}

TEST(OpsConvPool, AdaptiveAvgPool2dGlobalAndGeneral) {
  at::manual_seed(3);
  const at::Tensor x = rnd({2, 3, 5, 7});
  check_op({{x}, [](auto&, auto& t) { return one(adaptive_avg_pool2d(t[0], {1, 1})); },
            [](auto& t) { return one(at::adaptive_avg_pool2d(t[0], {1, 1})); }});
  check_op({{x}, [](auto&, auto& t) { return one(adaptive_avg_pool2d(t[0], {2, 3})); },
            [](auto& t) { return one(at::adaptive_avg_pool2d(t[0], {2, 3})); }});
}

}  // namespace
}  // namespace ht::test

namespace ht::test {
namespace {

// libtorch 1.13's bf16 CPU kernel leaves garbage in this weight gradient (a strided 3x3
// convolution over a 1x1 input, as in a ResNet's last stage on small images); ours must not.
TEST(OpsConvPool, Bf16StridedConvolutionOverOnePixel) {
  at::manual_seed(4);
  for (int64_t kernel : {3, 7}) {
    const at::Tensor x = at::randn({8, 16, 1, 1}).to(at::kBFloat16), w = at::randn({16, 16, kernel, kernel});
    const at::Tensor w16 = w.to(at::kBFloat16).requires_grad_(true);
    Interpreter interp;
    Conv2dArgs args;
    args.stride = {2, 2};
    args.padding = {kernel / 2, kernel / 2};
    const Tensor y = conv2d(interp.input(x), interp.param(w16), Tensor(), args);
    interp.backward({y}, {at::ones(y.sizes(), at::kBFloat16)});
    at::Tensor w32 = w16.detach().to(at::kFloat).requires_grad_(true);
    at::convolution(x.to(at::kFloat), w32, {}, {2, 2}, args.padding, {1, 1}, false, {0, 0}, 1).sum().backward();
    ASSERT_TRUE(at::isfinite(w16.grad()).all().item<bool>()) << "kernel " << kernel;
    EXPECT_TRUE(all_close(w16.grad().to(at::kFloat), w32.grad(), 1e-2, 1e-2)) << "kernel " << kernel;
  }
}

}  // namespace
}  // namespace ht::test

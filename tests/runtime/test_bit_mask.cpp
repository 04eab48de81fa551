// memory.compress's 1-bit masks: packing round-trips every shape, and relu's backward from the mask
// is threshold_backward's bit for bit, while backward no longer holds relu's output.
#include "runtime/bit_mask.h"
#include "memory/memory_manager.h"
#include "tests/support/op_check.h"

namespace ht::test {
namespace {

TEST(BitMask, RoundTripsEveryShape) {
  at::manual_seed(11);
  for (const std::vector<int64_t>& sizes : std::vector<std::vector<int64_t>>{{1}, {8}, {7}, {3, 5}, {2, 3, 7, 5}, {0}}) {
    SCOPED_TRACE(::testing::Message() << "sizes " << at::IntArrayRef(sizes));
    const at::Tensor mask = at::rand(sizes).gt(0.5);
    const at::Tensor packed = pack_bits(mask);
    EXPECT_EQ(packed.numel(), (mask.numel() + 7) / 8);
    EXPECT_EQ(packed.scalar_type(), at::kByte);
    EXPECT_TRUE(unpack_bits(packed, sizes).equal(mask));
  }
  const at::Tensor first = at::zeros({9}, at::kBool).index_fill(0, at::tensor({0, 8}, at::kLong), true);
  EXPECT_EQ(pack_bits(first)[0].item<int>(), 1) << "element i is bit i % 8";
  EXPECT_EQ(pack_bits(first)[1].item<int>(), 1);
  EXPECT_THROW(unpack_bits(pack_bits(first), {17}), c10::Error);
  EXPECT_THROW(pack_bits(at::zeros({3})), c10::Error);
}

// The gradient's values and its layout (which decides later kernels' summation order) both match,
// for a matrix and for a channels-last image batch.
TEST(BitMask, ReluFromTheMaskIsTheSameGradientAndHoldsOnlyTheMask) {
  at::manual_seed(12);
  const at::Tensor image = at::randn({4, 6, 5, 3}).contiguous(at::MemoryFormat::ChannelsLast);
  for (at::Tensor x : {at::randn({64, 33}), image}) {
    SCOPED_TRACE(::testing::Message() << "sizes " << x.sizes() << " strides " << x.strides());
    x.data_ptr<float>()[0] = 0;  // the boundary: relu's gradient at 0 is 0 in both
    const at::Tensor upstream = at::randn(x.sizes());
    auto grad_of = [&](bool masks, int64_t* held) {
      MemoryManager memory;
      Interpreter interp{{}, &memory};
      interp.set_relu_masks(masks);
      const at::Tensor weight = x.clone().requires_grad_(true);  // clone keeps the layout
      Tensor loss;
      {
        Tensor in = interp.param(weight);
        Tensor y = relu(in);
        EXPECT_TRUE(y.value().equal(at::relu(x)));
        Tensor z = relu(y);
        EXPECT_EQ(z.value().strides(), x.strides());
        loss = sum(mul(z, interp.input(upstream)));
      }
      *held = memory.stats().resident_bytes;  // what backward holds now
      interp.backward(loss);
      return weight.grad().clone(at::MemoryFormat::Preserve);
    };
    int64_t held_plain = 0, held_masks = 0;
    const at::Tensor plain = grad_of(false, &held_plain), masked = grad_of(true, &held_masks);
    EXPECT_TRUE(masked.equal(plain));
    EXPECT_EQ(masked.strides(), plain.strides());
    EXPECT_LT(held_masks, held_plain);
  }
  // Against libtorch autograd, on every test device.
  check_op({{at::randn({5, 7})}, [](Interpreter& interp, auto& t) {
              interp.set_relu_masks(true);
              return one(relu(t[0]));
            },
            [](auto& t) { return one(at::relu(t[0])); }});
}

}  // namespace
}  // namespace ht::test

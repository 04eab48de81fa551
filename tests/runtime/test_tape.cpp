// Reverse mode: what the tape keeps, when it lets go, and how gradients accumulate.
#include "tests/support/op_check.h"
#include "memory/memory_manager.h"

#include <algorithm>

namespace ht::test {
namespace {

TEST(Tape, SavedValuesAreReleasedByBackward) {
  MemoryManager memory;
  Interpreter interp{{}, &memory};
  at::Tensor w = at::randn({16, 16}).requires_grad_(true);
  Tensor h = interp.input(at::randn({4, 16}));
  for (int i = 0; i < 5; ++i) h = relu(linear(h, interp.param(w)));
  Tensor loss = sum(h);
  h.reset();
  EXPECT_EQ(memory.stats().resident_tensors, 6) << "5 relu outputs saved + the loss";
  interp.backward(loss);
  EXPECT_EQ(interp.tape().size(), 0u);
  EXPECT_EQ(memory.stats().resident_tensors, 1) << "only the loss the user holds";
  loss.reset();
  EXPECT_EQ(memory.stats().resident_tensors, 0);
  EXPECT_EQ(interp.live_records(), 0);
}

TEST(Tape, NoGradRecordsNothing) {
  MemoryManager memory;
  Interpreter interp{{}, &memory};
  at::Tensor w = at::randn({3, 3}).requires_grad_(true);
  NoGradGuard no_grad(interp);
  Tensor y = linear(interp.input(at::randn({2, 3})), interp.param(w));
  EXPECT_FALSE(y.requires_grad());
  EXPECT_EQ(interp.tape().size(), 0u);
  EXPECT_THROW(interp.backward(sum(y)), c10::Error);
}

TEST(Tape, SharedParameterAccumulatesAndRepeatedBackwardAdds) {
  at::manual_seed(3);
  at::Tensor w = at::randn({4, 4}, at::kDouble).requires_grad_(true);
  const at::Tensor a = at::randn({2, 4}, at::kDouble), b = at::randn({2, 4}, at::kDouble);
  MemoryManager memory;
  Interpreter interp{{}, &memory};
  for (int step = 0; step < 2; ++step) {
    Tensor y = add(linear(interp.input(a), interp.param(w)), linear(interp.input(b), interp.param(w)));
    interp.backward(sum(y));
  }
  at::Tensor w_ref = w.detach().clone().requires_grad_(true);
  for (int step = 0; step < 2; ++step) (at::linear(a, w_ref) + at::linear(b, w_ref)).sum().backward();
  EXPECT_TRUE(all_close(w.grad(), w_ref.grad()));
}

TEST(Tape, RejectsNonScalarLossAndMismatchedGradients) {
  MemoryManager memory;
  Interpreter interp{{}, &memory};
  at::Tensor w = at::randn({3}).requires_grad_(true);
  Tensor y = mul(interp.param(w), 2.0);
  EXPECT_THROW(interp.backward(y), c10::Error);
  EXPECT_THROW(interp.backward({y}, {at::ones({4})}), c10::Error);
}

TEST(Tape, AnyOneElementLossIsAScalar) {
  MemoryManager memory;
  Interpreter interp{{}, &memory};
  at::Tensor w = at::ones({1}).requires_grad_(true);
  interp.backward(mul(interp.param(w), 3.0));  // shape [1], not []
  EXPECT_EQ(w.grad().item<float>(), 3.0f);
}

TEST(Tape, BranchNotReachingLossIsSkipped) {
  MemoryManager memory;
  Interpreter interp{{}, &memory};
  at::Tensor w = at::randn({3}).requires_grad_(true), u = at::randn({3}).requires_grad_(true);
  Tensor used = mul(interp.param(w), 2.0);
  Tensor unused = mul(interp.param(u), 3.0);
  interp.backward(sum(used));
  EXPECT_TRUE(w.grad().defined());
  EXPECT_FALSE(u.grad().defined());
  EXPECT_FALSE(unused.info()->resident() && unused.info()->grad.defined());
}

// Records what a GradientListener is told, and each gradient as it was when declared final.
struct RecordingListener final : GradientListener {
  std::vector<const c10::TensorImpl*> pending;
  std::vector<const c10::TensorImpl*> ready;
  std::vector<at::Tensor> grads_when_ready;
  void backward_begins(const std::vector<const c10::TensorImpl*>& leaves) override { pending = leaves; }
  void gradient_ready(const at::Tensor& param) override {
    ready.push_back(param.unsafeGetTensorImpl());
    grads_when_ready.push_back(param.grad().clone());
  }
};

TEST(Tape, ListenerHearsOfEachGradientOnceWhenItIsFinal) {
  // w1 is used twice, through two leaf records (as models do: one per use); w3 not at all.
  at::manual_seed(4);
  at::Tensor w1 = at::randn({8, 8}, at::kDouble).requires_grad_(true);
  at::Tensor w2 = at::randn({8, 8}, at::kDouble).requires_grad_(true);
  at::Tensor w3 = at::randn({8, 8}, at::kDouble).requires_grad_(true);
  MemoryManager memory;
  Interpreter interp{{}, &memory};
  Tensor h = linear(interp.input(at::randn({3, 8}, at::kDouble)), interp.param(w1));
  h = linear(relu(h), interp.param(w2));
  h = linear(h, interp.param(w1));
  RecordingListener listener;
  interp.set_gradient_listener(&listener);
  interp.backward(sum(h));
  std::vector<const c10::TensorImpl*> pending = listener.pending;
  std::sort(pending.begin(), pending.end());
  std::vector<const c10::TensorImpl*> expected{w1.unsafeGetTensorImpl(), w2.unsafeGetTensorImpl()};
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(pending, expected) << "w3 is final already: nothing of this backward reaches it";
  ASSERT_EQ(listener.ready.size(), 2u) << "once per parameter, not once per use";
  EXPECT_EQ(listener.ready[0], w2.unsafeGetTensorImpl()) << "w2 is done before w1's first use is";
  EXPECT_EQ(listener.ready[1], w1.unsafeGetTensorImpl());
  EXPECT_TRUE(listener.grads_when_ready[0].equal(w2.grad()));
  EXPECT_TRUE(listener.grads_when_ready[1].equal(w1.grad())) << "both uses had been added";
}

}  // namespace
}  // namespace ht::test

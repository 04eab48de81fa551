// training.compute_weights = "kept": a weight's 16-bit copy made once per optimizer step and read
// as a leaf (alloc/weight_copies.h) gives the gradients autocast's cast at each read gives, bit
// for bit: the readers' gradients are summed as the cast copy summed them and handed to the
// weight when the last reader has run, in one backward or in a zero-bubble schedule's two parts.
#include "alloc/weight_copies.h"
#include "runtime/widening_add.h"
#include "tests/support/op_check.h"

#include <limits>
#include <map>

namespace ht::test {
namespace {

// Records each weight's gradient as it stands when the listener is told it is final.
class FinalGradients final : public GradientListener {
 public:
  void backward_begins(const std::vector<const c10::TensorImpl*>&) override {}
  void gradient_ready(const at::Tensor& param) override { seen[param.unsafeGetTensorImpl()] = param.grad().clone(); }
  std::map<const c10::TensorImpl*, at::Tensor> seen;
};

struct Trainee {
  explicit Trainee(bool kept) {
    interp.set_autocast(at::kBFloat16);
    if (kept) interp.set_compute_weights(&copies);
    interp.set_gradient_listener(&listener);
  }
  // Two products read w, one reads v; the norm's gain g stays fp32 (no copy).
  Tensor forward(const at::Tensor& x) {
    const Tensor h = linear(interp.input(x), interp.param(w));
    const Tensor n = rms_norm(h, interp.param(g), 1e-5);
    return linear(relu(linear(n, interp.param(w))), interp.param(v));
  }
  at::Tensor w = (at::randn({8, 8}) * 0.3).requires_grad_(true);
  at::Tensor v = (at::randn({3, 8}) * 0.3).requires_grad_(true);
  at::Tensor g = at::ones({8}).requires_grad_(true);
  WeightCopies copies;
  FinalGradients listener;
  Interpreter interp;
};

void same_start(Trainee& a, Trainee& b) {
  at::NoGradGuard no_grad;
  b.w.copy_(a.w);
  b.v.copy_(a.v);
}

void update(Trainee& r) {  // what an optimizer step does, and the step's notice to the copies
  at::NoGradGuard no_grad;
  for (at::Tensor* p : {&r.w, &r.v, &r.g}) {
    p->sub_(p->grad() * 0.1);
    p->mutable_grad() = at::Tensor();
  }
  r.copies.weights_changed();
}

TEST(WeightCopies, KeptCopiesGiveTheCastsGradientsBitForBit) {
  at::manual_seed(3);
  Trainee cast_run(false), kept(true);
  same_start(cast_run, kept);
  for (int step = 0; step < 3; ++step) {
    for (int micro = 0; micro < 2; ++micro) {  // accumulation: the second adds to the first's
      const at::Tensor x = at::randn({4, 8});
      const Tensor yc = cast_run.forward(x), yk = kept.forward(x);
      ASSERT_TRUE(yc.value().equal(yk.value())) << "step " << step << ": the same forward values";
      cast_run.interp.backward(sum(mul(yc, yc)));
      kept.listener.seen.clear();
      kept.interp.backward(sum(mul(yk, yk)));
      // Told final only once the copy's sum reached the weight (w's copy has two readers, v's
      // one): what it saw is what stays.
      for (const at::Tensor* p : {&kept.w, &kept.v}) {
        ASSERT_TRUE(kept.listener.seen.count(p->unsafeGetTensorImpl())) << "step " << step;
        EXPECT_TRUE(kept.listener.seen.at(p->unsafeGetTensorImpl()).equal(p->grad())) << "step " << step;
      }
    }
    for (auto [a, b] : {std::pair{&cast_run.w, &kept.w}, {&cast_run.v, &kept.v}, {&cast_run.g, &kept.g}}) {
      ASSERT_EQ(b->grad().scalar_type(), at::kFloat) << "an fp32 gradient for the fp32 weight";
      EXPECT_TRUE(a->grad().equal(b->grad())) << "step " << step;
    }
    update(cast_run);
    update(kept);
    EXPECT_EQ(kept.copies.made_last_step(), step == 0 ? 0 : 2) << "w's and v's copies, once in the step's 2 forwards";
    if (step == 0) EXPECT_EQ(kept.copies.bytes(), (8 * 8 + 3 * 8) * 2) << "laid out after the first step: w and v";
  }
}

TEST(WeightCopies, ZeroBubblesTwoPartsGiveTheSameBits) {
  at::manual_seed(4);
  Trainee cast_run(false), kept(true);
  same_start(cast_run, kept);
  for (int step = 0; step < 2; ++step) {
    const at::Tensor x = at::randn({4, 8});
    std::vector<Tape> tapes;
    std::vector<Tensor> outs;
    for (Trainee* r : {&cast_run, &kept}) {
      outs.push_back(r->forward(x));
      tapes.push_back(r->interp.take_tape());
    }
    for (size_t i = 0; i < 2; ++i) {
      Trainee& r = i == 0 ? cast_run : kept;
      r.interp.backward(tapes[i], {outs[i]}, {at::ones_like(outs[i].value())}, BackwardPart::kInputs);
      EXPECT_FALSE(r.w.grad().defined()) << "the weights' part is deferred";
      r.interp.backward(tapes[i], {}, {}, BackwardPart::kWeights);
    }
    EXPECT_TRUE(cast_run.w.grad().equal(kept.w.grad()));
    EXPECT_TRUE(cast_run.v.grad().equal(kept.v.grad()));
    update(cast_run);
    update(kept);
    // The first step casts; from the second the products read the kept copies.
    EXPECT_EQ(kept.copies.size(), 2u);
    if (step == 1) EXPECT_EQ(kept.copies.made_last_step(), 2);
  }
}

TEST(WeightCopies, ACopyIsMadeAgainWhenItsWeightChangesInPlace) {
  WeightCopies copies;
  const at::Tensor w = at::randn({4, 4});
  EXPECT_FALSE(copies.copy_of(w, at::kBFloat16).defined()) << "the first step casts";
  copies.weights_changed();
  EXPECT_TRUE(copies.copy_of(w, at::kBFloat16).equal(w.to(at::kBFloat16)));
  w.add_(1.0);  // a checkpoint's read, say, without weights_changed()
  EXPECT_TRUE(copies.copy_of(w, at::kBFloat16).equal(w.to(at::kBFloat16))) << "not stale";
  EXPECT_FALSE(copies.copy_of(at::randn({2}), at::kBFloat16).defined()) << "not cast in the first step: cast";
}

// The bf16 gradient added into an fp32 one in one pass: the bits of converting it first, at sizes
// that end between vector lengths and across threads' grains, and in other layouts by conversion.
TEST(WeightCopies, AWideningAddHasTheBitsOfAConversionAndAnAdd) {
  at::manual_seed(5);
  for (int64_t n : {1, 7, 33, 100003}) {
    at::Tensor acc = at::randn({n}), expected = acc.clone();
    const at::Tensor g = at::randn({n}).to(at::kBFloat16);
    add_widened(acc, g);
    expected.add_(g.to(at::kFloat));
    EXPECT_TRUE(acc.equal(expected)) << n;
  }
  at::Tensor acc = at::randn({4, 6}), expected = acc.clone();
  const at::Tensor g = at::randn({6, 4}).to(at::kBFloat16).t();  // strides differ: converted first
  add_widened(acc, g);
  expected.add_(g.to(at::kFloat));
  EXPECT_TRUE(acc.equal(expected));
}

// The other way (training.gradient_dtype = "bf16": an fp32 gradient into a bf16 slot): added in
// fp32 and rounded once, ATen's mixed add_'s bits, in one pass; NaN stays NaN.
TEST(WeightCopies, ANarrowingAddRoundsOnceAsAtensMixedAdd) {
  at::manual_seed(6);
  for (int64_t n : {1, 7, 33, 100003}) {
    at::Tensor acc = at::randn({n}).to(at::kBFloat16), expected = acc.clone(), twice = acc.clone();
    at::Tensor g = at::randn({n}) * 3;
    if (n == 33) g[5] = std::numeric_limits<float>::quiet_NaN();
    add_widened(acc, g);
    expected.add_(g);
    EXPECT_TRUE(at::equal(acc.to(at::kFloat).nan_to_num(7), expected.to(at::kFloat).nan_to_num(7))) << n;
    if (n == 100003) {
      twice.add_(g.to(at::kBFloat16));  // g rounded, then the sum: what converting first would give
      EXPECT_FALSE(acc.equal(twice)) << "one rounding, not two";
    }
  }
  at::Tensor acc = at::randn({4, 6}).to(at::kBFloat16), expected = acc.clone();
  const at::Tensor g = at::randn({6, 4}).t();  // strides differ: ATen's add_
  add_widened(acc, g);
  expected.add_(g);
  EXPECT_TRUE(acc.equal(expected));
}

}  // namespace
}  // namespace ht::test

// Moving state that lives across steps into one block (training/compact.h): the same
// bits before and after, the state laid out in one piece, and an optimizer that steps on from
// the moved state exactly as from its own.
#include "training/optimizer_options.h"
#include "training/compact.h"
#include "training/optimizer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/optimizer.h>

namespace ht::test {
namespace {

std::vector<at::Tensor> make_params() {
  at::manual_seed(21);
  return {at::randn({4, 3, 3, 3}).contiguous(at::MemoryFormat::ChannelsLast).requires_grad_(true),
          at::randn({7}).requires_grad_(true), at::randn({5, 6}).requires_grad_(true)};
}

void set_grads(const std::vector<at::Tensor>& params, int step) {
  at::manual_seed(100 + step);
  for (const at::Tensor& p : params) p.mutable_grad() = at::randn_like(p);
}

TEST(Compact, KeepsBitsAndStridesInOneBlock) {
  const std::vector<at::Tensor> params = make_params();
  const std::vector<at::Tensor> moved = into_one_block(copies_on_host(params), at::kCPU);
  ASSERT_EQ(moved.size(), params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(moved[i].equal(params[i].detach()));
    EXPECT_EQ(moved[i].strides(), params[i].strides());
    EXPECT_TRUE(moved[i].storage().is_alias_of(moved[0].storage())) << "one block";
  }
  EXPECT_EQ(static_cast<char*>(moved[1].data_ptr()) - static_cast<char*>(moved[0].data_ptr()), 4 * 3 * 3 * 3 * 4);
}

TEST(Compact, OptimizerStepsOnFromTheMovedStateBitForBit) {
  for (const char* name : {"sgd", "adamw"}) {
    SCOPED_TRACE(name);
    OptimizerOptions t;
    t.kind = *parse_choice<OptimizerKind>(name);
    t.momentum = 0.9;
    t.weight_decay = 0.01;
    const std::vector<at::Tensor> a = make_params(), b = make_params();
    auto opt_a = make_optimizer(t, a), opt_b = make_optimizer(t, b);
    EXPECT_FALSE(compact_optimizer_state(*opt_b, b)) << "no state before the first step";
    for (int step = 0; step < 3; ++step) {
      set_grads(a, step);
      set_grads(b, step);
      opt_a->step();
      opt_b->step();
      if (step == 0) {
        ASSERT_TRUE(compact_optimizer_state(*opt_b, b));
        const std::vector<at::Tensor> first = optimizer_state(*opt_b, b[0]), last = optimizer_state(*opt_b, b[2]);
        EXPECT_TRUE(first.back().storage().is_alias_of(last.back().storage())) << "the state in one block";
      }
    }
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(a[i].equal(b[i])) << "parameter " << i;
      const std::vector<at::Tensor> sa = optimizer_state(*opt_a, a[i]), sb = optimizer_state(*opt_b, b[i]);
      ASSERT_EQ(sa.size(), sb.size());
      for (size_t k = 0; k < sa.size(); ++k) EXPECT_TRUE(sa[k].equal(sb[k])) << "state " << k << " of parameter " << i;
    }
  }
}

}  // namespace
}  // namespace ht::test

// Views share their root's storage: the root stays resident while a view is, evicting a root
// evicts its views, and a dropped view is regenerated from its base.
#include "tests/support/op_check.h"
#include "memory/memory_manager.h"

namespace ht::test {
namespace {

constexpr int64_t kBytes = 6 * 4 * 4;  // a (6, 4) float tensor

TEST(Views, ViewKeepsRootStorageAndAccountsItOnce) {
  MemoryManager memory;
  Interpreter interp{{}, &memory};
  Tensor r = mul(interp.input(at::ones({6, 4})), 3.0);
  Tensor v = transpose(r, 0, 1);
  EXPECT_TRUE(v.info()->is_view());
  EXPECT_EQ(v.info()->base, r.info());
  EXPECT_EQ(memory.stats().resident_bytes, kBytes) << "a view owns no bytes";
  TensorInfo* root = r.info();
  r.reset();  // the root's handle goes, but the view still reads its storage
  EXPECT_TRUE(root->resident());
  EXPECT_EQ(memory.stats().resident_bytes, kBytes);
  v.reset();
  EXPECT_EQ(memory.stats().resident_bytes, 0);
}

TEST(Views, EvictingRootEvictsViewsAndBothComeBack) {
  MemoryManager memory;
  Interpreter interp{{}, &memory};
  Tensor r = mul(interp.input(at::arange(24, at::kFloat).reshape({6, 4})), 2.0);
  Tensor v = slice(r, 0, 1, 5, 2);
  const at::Tensor expected = v.value().clone();
  interp.evict(*r.info());
  EXPECT_FALSE(r.info()->resident());
  EXPECT_FALSE(v.info()->resident());
  EXPECT_EQ(memory.stats().resident_bytes, 0);
  EXPECT_TRUE(v.value().equal(expected));
  EXPECT_TRUE(v.value().is_alias_of(r.info()->value)) << "regenerated view shares its root again";
  EXPECT_EQ(memory.stats().resident_bytes, kBytes);
}

TEST(Views, EvictingViewAloneFreesNothingAndRegeneratesFromBase) {
  MemoryManager memory;
  Interpreter interp{{}, &memory};
  Tensor r = mul(interp.input(at::ones({6, 4})), 2.0);
  Tensor v = reshape(r, {24});
  interp.evict(*v.info());
  EXPECT_TRUE(r.info()->resident());
  EXPECT_EQ(memory.stats().resident_bytes, kBytes);
  EXPECT_EQ(v.value().sizes(), at::IntArrayRef({24}));
  EXPECT_EQ(memory.stats().recomputations, 1) << "only the view op re-ran";
}

TEST(Views, CopyingReshapeIsARootAndSplitPiecesAreViews) {
  MemoryManager memory;
  Interpreter interp{{}, &memory};
  Tensor r = mul(interp.input(at::ones({6, 4})), 2.0);
  Tensor copy = reshape(transpose(r, 0, 1), {24});  // not viewable: a copy
  EXPECT_FALSE(copy.info()->is_view());
  EXPECT_EQ(copy.info()->nbytes, kBytes);
  std::vector<Tensor> pieces = split(r, 2, 0);
  ASSERT_EQ(pieces.size(), 3u);
  for (const Tensor& p : pieces) EXPECT_EQ(p.info()->base, r.info());
}

TEST(Views, ViewOfViewPointsAtTheRoot) {
  MemoryManager memory;
  Interpreter interp{{}, &memory};
  Tensor r = mul(interp.input(at::ones({2, 3, 4})), 2.0);
  Tensor v2 = reshape(transpose(r, 1, 2), {2, 4, 3});  // transpose is a view; reshape keeps it
  EXPECT_EQ(v2.info()->base, r.info());
}

}  // namespace
}  // namespace ht::test

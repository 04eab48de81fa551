// A step's middle layer copied (planner/repeated_layers.h) on hand-written traces: a chain of
// layers, each reading the one before in forward and handing a gradient back in backward, is the
// same chain written for more layers; a layer that reads past its neighbour is refused.
#include "planner/repeated_layers.h"

#include <gmock/gmock.h>

namespace ht::test {
namespace {

using ::testing::HasSubstr;

// An embedding (block 0), `layers` identical layers and a head (block layers + 1). Forward: each
// block's kernel reads the block before's output and makes its own; backward, from the head
// down: each block's kernel reads its input, makes its input's gradient, frees its output and the
// gradient it was handed, and makes its parameters' gradients (bucket blocks - 1 - b: reduction
// order runs from the head). With `casts`, each block's forward also makes a copy of a weight
// that the head frees, all of them in the order they were made, when forward is over (the
// autocast cache).
StepTrace chain(int layers, bool casts = false) {
  StepTrace t;
  t.persistent_bytes = 4096;
  const int blocks = layers + 2;
  auto begin = [&](int block, bool backward, std::vector<int> inputs) {
    TraceKernel k;
    k.op = backward ? "layer backward" : "layer";
    k.block = block;
    k.backward = backward;
    k.flops = 1000.0 * (block == 0 ? 1 : 2);
    k.inputs = std::move(inputs);
    if (backward) k.gradient_buckets = {blocks - 1 - block};
    t.kernels.push_back(k);
    t.events.push_back({TraceEvent::Kind::kKernelBegins, static_cast<int>(t.kernels.size()) - 1});
    return static_cast<int>(t.kernels.size()) - 1;
  };
  auto allocate = [&](int64_t bytes, int producer) {
    t.tensors.push_back({bytes, producer, producer >= 0});
    t.events.push_back({TraceEvent::Kind::kAllocated, static_cast<int>(t.tensors.size()) - 1});
    return static_cast<int>(t.tensors.size()) - 1;
  };
  auto end = [&](int k) { t.events.push_back({TraceEvent::Kind::kKernelEnds, k}); };
  auto free = [&](int tensor) { t.events.push_back({TraceEvent::Kind::kFreed, tensor}); };
  std::vector<int> out(static_cast<size_t>(blocks)), cast;
  for (int b = 0; b < blocks; ++b) {
    const int k = begin(b, false, b == 0 ? std::vector<int>{} : std::vector<int>{out[static_cast<size_t>(b - 1)]});
    if (casts) cast.push_back(allocate(64, -1));
    out[static_cast<size_t>(b)] = allocate(b == 0 ? 256 : 512, k);
    end(k);
  }
  for (int c : cast) free(c);
  int handed = -1;
  for (int b = blocks - 1; b >= 0; --b) {
    const int k = begin(b, true, b == 0 ? std::vector<int>{} : std::vector<int>{out[static_cast<size_t>(b - 1)]});
    const int grad = b == 0 ? -1 : allocate(512, -1);
    free(out[static_cast<size_t>(b)]);
    if (handed >= 0) free(handed);
    handed = grad;
    end(k);
  }
  return t;
}

LayerRepeat repeat(int target) {
  LayerRepeat r;
  r.first = 1;
  r.layers = 3;
  r.target_layers = target;
  for (int b = 0; b < 5; ++b) r.shallow_buckets[b] = {4 - b};
  for (int b = 0; b < target + 2; ++b) r.deep_buckets[b] = {target + 1 - b};
  return r;
}

TEST(RepeatedLayers, AChainStretchedIsTheLongerChain) {
  for (int target : {3, 4, 9}) {
    std::string why, difference;
    const StepTrace stretched = repeat_layers(chain(3), repeat(target), why);
    EXPECT_EQ(why, "");
    EXPECT_TRUE(same_step(stretched, chain(target), &difference)) << target << " layers: " << difference;
  }
  // Forward keeps every block's output: the peak is all of them and the first gradient.
  EXPECT_EQ(live_peak_bytes(chain(9)), 256 + 10 * 512 + 512);
  EXPECT_EQ(repeat_buckets({0, 2, 4}, repeat(6)), (std::vector<size_t>{0, 2, 3, 4, 5, 7}));
}

TEST(RepeatedLayers, TheHeadsFreesOfEveryLayersCastsStretch) {
  std::string why, difference;
  const StepTrace stretched = repeat_layers(chain(3, true), repeat(7), why);
  EXPECT_EQ(why, "");
  EXPECT_TRUE(same_step(stretched, chain(7, true), &difference)) << difference;
}

TEST(RepeatedLayers, ALayerReadingPastItsNeighbourIsRefused) {
  StepTrace t = chain(3);
  // The third layer's forward (kernel 3) reads the first layer's output (tensor 1) too.
  t.kernels[3].inputs.push_back(1);
  std::string why;
  EXPECT_TRUE(repeat_layers(t, repeat(6), why).events.empty());
  EXPECT_THAT(why, HasSubstr("not beside it"));
}

TEST(RepeatedLayers, ABlockRunTwiceIsRefused) {
  StepTrace t = chain(3);
  t.kernels[4].block = 2;  // the head's forward counted as the second layer's, after the third
  std::string why;
  EXPECT_TRUE(repeat_layers(t, repeat(6), why).events.empty());
  EXPECT_THAT(why, HasSubstr("not one run"));
}

}  // namespace
}  // namespace ht::test

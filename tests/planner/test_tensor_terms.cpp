// The planner's tensor-parallel terms (planner/tensor_terms.h) against the split decoder run on
// thread ranks: the elements each kind of collective is handed in a micro-batch's forward and
// backward are exactly the formula's, and each layer's saved activations per rank are the
// accounting's within 5% (GPT-2 and Llama, t = 2 and 4, with and without sequence parallelism).
#include "memory/memory_manager.h"
#include "models/decoder.h"
#include "parallel/thread_group.h"
#include "planner/tensor_terms.h"

#include <gtest/gtest.h>

namespace ht::test {
namespace {

struct Counted {
  int64_t allreduce = 0, allgather = 0, reducescatter = 0;
  int64_t layer_bytes = 0;  // resident bytes a middle layer's forward added
};

Counted run_split(DecoderOptions o, int t, bool sp, int64_t batch) {
  o.tensor_parallel = t;
  o.sequence_parallel = sp;
  std::vector<std::unique_ptr<Decoder>> parts;
  for (int r = 0; r < t; ++r) {
    DecoderOptions p = o;
    p.tensor_rank = r;
    at::manual_seed(3);
    parts.push_back(std::make_unique<Decoder>(p));
  }
  at::manual_seed(4);
  const at::Tensor tokens = at::randint(0, o.vocab_size, {batch, o.block_size}, at::kLong);
  Counted out;
  run_ranks(t, [&](int rank, ThreadGroup& group) {
    MemoryManager memory;
    Interpreter interp({}, &memory);
    interp.set_tensor_parallel(&group);
    Decoder& model = *parts[rank];
    int64_t before = 0, layer = 0;
    model.set_block_listener([&](int block) {  // block 2 is the second layer ("h1")
      if (block == 2) before = memory.stats().resident_bytes;
      if (block == 3) layer = memory.stats().resident_bytes - before;
    });
    interp.backward(model.loss(model.forward(interp.input(tokens)), interp.input(tokens)));
    if (rank == 0) out = {group.allreduce_elements(), group.allgather_elements(), group.reducescatter_elements(), layer};
  });
  return out;
}

void expect_terms_hold(const DecoderOptions& o, const std::string& label) {
  const int64_t batch = 2;
  for (int t : {2, 4}) {
    for (bool sp : {false, true}) {
      SCOPED_TRACE(label + " t=" + std::to_string(t) + (sp ? " SP" : ""));
      const Counted got = run_split(o, t, sp, batch);
      const TensorTraffic want = tensor_parallel_traffic(tensor_shape(o), batch, t, sp);
      EXPECT_EQ(got.allreduce, want.allreduce_elements);
      EXPECT_EQ(got.allgather, want.allgather_elements);
      EXPECT_EQ(got.reducescatter, want.reducescatter_elements);
      const int64_t accounted = layer_activation_bytes(tensor_shape(o), batch, t, sp);
      EXPECT_NEAR(static_cast<double>(got.layer_bytes) / static_cast<double>(accounted), 1.0, 0.05)
          << got.layer_bytes << " measured, " << accounted << " accounted";
    }
  }
}

TEST(TensorTerms, TrafficAndActivationsAreTheSplitLlamasOwn) {
  DecoderOptions o = DecoderOptions::llama(37, 16, 3, 8, 4, 64);
  o.multiple_of = 16;
  expect_terms_hold(o, "llama");
}

TEST(TensorTerms, TrafficAndActivationsAreTheSplitGpt2sOwn) {
  expect_terms_hold(DecoderOptions::gpt2(37, 16, 3, 4, 64, 0.0), "gpt");
}

TEST(TensorTerms, OneRankHasNoTraffic) {
  EXPECT_EQ(tensor_parallel_traffic(tensor_shape(DecoderOptions::gpt2(37, 16, 3, 4, 64, 0.0)), 2, 1, true).elements(), 0);
  Machine m;
  EXPECT_EQ(tensor_parallel_ms(m, 1, TensorTraffic{}, 4), 0.0);
}

}  // namespace
}  // namespace ht::test

// The decoder over a context-parallel group (runtime/context_parallel.h) against the one-rank
// decoder: ranks are threads of one process (parallel/thread_group.h), each fed its head and tail
// chunks of the same sequences. The mean of the ranks' losses is the one-rank loss and the mean of
// their gradients the one-rank gradient (what the trainer's reduction over the group makes),
// within fp32 reduction order: GPT-2 (learned positions) and Llama (rotary positions, grouped-query
// attention) at c = 2 and 4, and c = 2 with tensor parallelism t = 2, with and without sequence
// parallelism (a grid of four threads, each in a context group and a tensor-parallel group).
#include "models/decoder.h"
#include "models/decoder_split.h"
#include "parallel/thread_group.h"

#include <gtest/gtest.h>

#include <map>

namespace ht::test::decoder_context_tests {

struct Outcome {
  double loss = 0;
  std::map<std::string, at::Tensor> grads;  // by parameter name
};

Outcome step(Decoder& model, Interpreter& interp, const at::Tensor& tokens, const at::Tensor& targets) {
  const Tensor loss = model.loss(model.forward(interp.input(tokens)), interp.input(targets));
  interp.backward(loss);
  Outcome out{loss.value().item<double>(), {}};
  for (const auto& item : model.named_parameters()) out.grads[item.key()] = item.value().grad().clone();
  return out;
}

// Runs body(context rank, tensor rank, context group, tensor group) on c x t threads.
void run_grid(int c, int t, const std::function<void(int, int, ThreadGroup&, ThreadGroup&)>& body) {
  std::vector<std::shared_ptr<ThreadGroupState>> context_states, tensor_states;
  for (int i = 0; i < t; ++i) context_states.push_back(std::make_shared<ThreadGroupState>(c));
  for (int i = 0; i < c; ++i) tensor_states.push_back(std::make_shared<ThreadGroupState>(t));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(c * t));
  std::vector<std::thread> threads;
  for (int cr = 0; cr < c; ++cr) {
    for (int tr = 0; tr < t; ++tr) {
      threads.emplace_back([&, cr, tr] {
        ThreadGroup context(context_states[tr], cr), tensor(tensor_states[cr], tr);
        try {
          body(cr, tr, context, tensor);
        } catch (...) {
          errors[cr * t + tr] = std::current_exception();
        }
      });
    }
  }
  for (auto& th : threads) th.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

void expect_context_split_matches(const DecoderOptions& o, int c, int t, bool sequence_parallel, const std::string& label) {
  SCOPED_TRACE(label + " c=" + std::to_string(c) + " t=" + std::to_string(t) + (sequence_parallel ? " SP" : ""));
  at::manual_seed(11);
  const at::Tensor tokens = at::randint(0, o.vocab_size, {2, o.block_size}, at::kLong);
  const at::Tensor targets = at::randint(0, o.vocab_size, {2, o.block_size}, at::kLong);
  at::manual_seed(7);
  Decoder whole(o);
  Interpreter one;
  const Outcome expected = step(whole, one, tokens, targets);

  std::vector<std::unique_ptr<Decoder>> parts;  // built here, one after another: one global generator
  for (int cr = 0; cr < c; ++cr) {
    for (int tr = 0; tr < t; ++tr) {
      DecoderOptions p = o;
      p.context_parallel = c;
      p.context_rank = cr;
      p.tensor_parallel = t;
      p.tensor_rank = tr;
      p.sequence_parallel = sequence_parallel;
      ASSERT_EQ(p.problem(), "");
      at::manual_seed(7);
      parts.push_back(std::make_unique<Decoder>(p));
    }
  }
  std::vector<Outcome> got(static_cast<size_t>(c * t));
  run_grid(c, t, [&](int cr, int tr, ThreadGroup& context, ThreadGroup& tensor) {
    const ContextLayout layout{c, cr};
    Interpreter interp;
    interp.set_context_parallel(&context);
    if (t > 1) interp.set_tensor_parallel(&tensor);
    got[cr * t + tr] = step(*parts[cr * t + tr], interp, layout.part_of(tokens, 1), layout.part_of(targets, 1));
  });
  for (int tr = 0; tr < t; ++tr) {
    double loss = 0;
    std::map<std::string, at::Tensor> mean;
    for (int cr = 0; cr < c; ++cr) {
      const Outcome& g = got[cr * t + tr];
      loss += g.loss / c;
      for (const auto& [name, grad] : g.grads) mean[name] = mean.count(name) ? mean[name] + grad / c : grad / c;
    }
    EXPECT_NEAR(loss, expected.loss, 1e-5) << "tensor rank " << tr;
    const DecoderOptions& p = parts[tr]->options();
    for (const auto& [name, grad] : mean) {
      const at::Tensor want = part_of(expected.grads.at(name), decoder_parameter_split(p, name));
      ASSERT_EQ(grad.sizes(), want.sizes()) << name;
      EXPECT_TRUE(at::allclose(grad, want, 1e-4, 1e-6))
          << "tensor rank " << tr << " " << name << ": max difference " << (grad - want).abs().max().item<double>();
    }
  }
}

DecoderOptions context_llama() {
  DecoderOptions o = DecoderOptions::llama(37, 16, 2, 8, 4, 32);  // grouped-query: 8 heads, 4 key/value heads
  o.multiple_of = 16;
  return o;
}

TEST(DecoderContextParallel, Gpt2OnChunksOfTheSequenceIsTheWholeModel) {
  const DecoderOptions gpt = DecoderOptions::gpt2(37, 16, 2, 4, 16, 0.0);
  expect_context_split_matches(gpt, 2, 1, false, "gpt");
  expect_context_split_matches(gpt, 4, 1, false, "gpt");
}

TEST(DecoderContextParallel, LlamaOnChunksOfTheSequenceIsTheWholeModel) {
  expect_context_split_matches(context_llama(), 2, 1, false, "llama");
  expect_context_split_matches(context_llama(), 4, 1, false, "llama");
}

TEST(DecoderContextParallel, WithTensorAndSequenceParallelismItIsTheWholeModel) {
  expect_context_split_matches(context_llama(), 2, 2, false, "llama");
  expect_context_split_matches(context_llama(), 2, 2, true, "llama");
  expect_context_split_matches(DecoderOptions::gpt2(37, 16, 2, 4, 16, 0.0), 2, 2, true, "gpt");
}

// Each context rank holds other chunks of the sequence in activations of one shape: its dropout
// masks must be its own, not the other ranks' drawn again at other positions. The same tokens on
// both ranks, through the embedding and its dropout: other masks; on one rank twice, the same.
TEST(DecoderContextParallel, EachContextRankDrawsItsOwnDropoutMasks) {
  DecoderOptions o = context_llama();
  o.dropout = 0.5;
  o.context_parallel = 2;
  const at::Tensor tokens = at::randint(0, o.vocab_size, {2, 8}, at::kLong);
  auto embedded = [&](int64_t rank) {
    DecoderOptions p = o;
    p.context_rank = rank;
    at::manual_seed(7);
    Decoder model(p);
    model.train();
    Interpreter interp;
    return model.blocks().front()->forward(interp.input(tokens)).value().clone();
  };
  const at::Tensor zero = embedded(0), one = embedded(1);
  EXPECT_TRUE(at::equal(zero, embedded(0)));
  EXPECT_FALSE(at::equal(zero.eq(0), one.eq(0))) << "the same mask on both context ranks";
}

TEST(DecoderContextParallel, ABlockSizeThatDoesNotSplitIsRefusedNamingTheKeys) {
  DecoderOptions o = context_llama();
  o.context_parallel = 3;  // 16 tokens in 6 chunks
  const DecoderOptions::Diagnosis d = o.diagnose();
  EXPECT_NE(d.message.find("model.block_size = 16 is not a multiple of 2 x parallel.context_parallel = 3"),
            std::string::npos)
      << d.message;
  EXPECT_EQ(d.keys, (std::vector<std::string>{"model.block_size", "parallel.context_parallel"}));
  o.context_parallel = 4;
  o.tensor_parallel = 8;
  o.n_head = 8;
  o.n_kv_heads = 8;
  o.sequence_parallel = true;  // 4 tokens a rank, cut in 8
  EXPECT_NE(o.problem().find("is not a multiple of parallel.tensor_parallel = 8"), std::string::npos) << o.problem();
}

}  // namespace ht::test::decoder_context_tests

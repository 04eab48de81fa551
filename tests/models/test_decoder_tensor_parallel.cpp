// The decoder split over a tensor-parallel group (models/decoder_split.h) against the one-rank
// decoder it is a part of: ranks are threads of one process (parallel/thread_group.h). Equal
// losses, and each rank's gradient of each parameter equal to its part of the one-rank gradient,
// within fp32 reduction order: GPT-2 (biases, learned positions, tied head) and Llama
// (grouped-query attention, SwiGLU, tied and untied), at t = 2 and 4, with and without sequence
// parallelism, with a vocabulary that t does not divide (padded).
#include "models/decoder.h"
#include "models/decoder_split.h"
#include "models/tensor_parallel_plan.h"
#include "parallel/thread_group.h"

#include <gtest/gtest.h>

#include <map>

namespace ht::test {
namespace {

struct Outcome {
  double loss = 0;
  std::map<std::string, at::Tensor> grads;  // by parameter name
};

Outcome train_once(Decoder& model, Interpreter& interp, const at::Tensor& tokens, const at::Tensor& targets) {
  const Tensor loss = model.loss(model.forward(interp.input(tokens)), interp.input(targets));
  interp.backward(loss);
  Outcome out{loss.value().item<double>(), {}};
  for (const auto& item : model.named_parameters()) out.grads[item.key()] = item.value().grad().clone();
  return out;
}

void expect_split_matches(DecoderOptions o, int t, bool sequence_parallel, const std::string& label) {
  SCOPED_TRACE(label + " t=" + std::to_string(t) + (sequence_parallel ? " SP" : ""));
  at::manual_seed(11);
  const at::Tensor tokens = at::randint(0, o.vocab_size, {2, o.block_size}, at::kLong);
  const at::Tensor targets = at::randint(0, o.vocab_size, {2, o.block_size}, at::kLong);
  at::manual_seed(7);
  Decoder whole(o);
  Interpreter one;
  const Outcome expected = train_once(whole, one, tokens, targets);

  std::vector<std::unique_ptr<Decoder>> parts;  // built here: the global generator is one
  for (int r = 0; r < t; ++r) {
    DecoderOptions p = o;
    p.tensor_parallel = t;
    p.tensor_rank = r;
    p.sequence_parallel = sequence_parallel;
    at::manual_seed(7);
    parts.push_back(std::make_unique<Decoder>(p));
  }
  std::vector<Outcome> got(static_cast<size_t>(t));
  run_ranks(t, [&](int rank, ThreadGroup& group) {
    Interpreter interp;
    interp.set_tensor_parallel(&group);
    got[rank] = train_once(*parts[rank], interp, tokens, targets);
  });
  for (int r = 0; r < t; ++r) {
    EXPECT_NEAR(got[r].loss, expected.loss, 1e-5) << "rank " << r;
    const DecoderOptions& p = parts[r]->options();
    for (const auto& [name, grad] : got[r].grads) {
      const at::Tensor& full = expected.grads.at(name);
      const at::Tensor want = part_of(full, decoder_parameter_split(p, name));
      ASSERT_EQ(grad.sizes(), want.sizes()) << name;
      EXPECT_TRUE(at::allclose(grad, want, 1e-4, 1e-6))
          << "rank " << r << " " << name << ": max difference " << (grad - want).abs().max().item<double>();
    }
  }
}

DecoderOptions small_llama(bool tied) {
  DecoderOptions o = DecoderOptions::llama(37, 8, 2, 8, 4, 32);  // grouped-query: 8 heads, 4 key/value heads
  o.multiple_of = 16;  // MLP width 96
  o.tie_embeddings = tied;
  return o;
}

TEST(DecoderTensorParallel, Gpt2PartsAreTheWholeModel) {
  const DecoderOptions gpt = DecoderOptions::gpt2(37, 8, 2, 4, 16, 0.0);
  for (int t : {2, 4}) {
    expect_split_matches(gpt, t, false, "gpt");
    expect_split_matches(gpt, t, true, "gpt");
  }
}

TEST(DecoderTensorParallel, LlamaPartsAreTheWholeModel) {
  for (int t : {2, 4}) {
    for (bool sp : {false, true}) {
      expect_split_matches(small_llama(false), t, sp, "llama untied");
      expect_split_matches(small_llama(true), t, sp, "llama tied");
    }
  }
}

// The split is one plan per model (models/tensor_parallel_plan.h): every parameter a rank holds
// a part of belongs to a layer the plan splits, and every layer the plan splits is one the model
// has, its parameters' parts as the style says (a column-wise layer's rows, a row-wise layer's
// columns and its bias whole, the vocabulary's rows).
TEST(DecoderTensorParallel, ThePlanNamesEverySplitLayerAndItsStyleShapesItsParts) {
  for (const DecoderOptions& base : {DecoderOptions::gpt2(37, 8, 2, 4, 16, 0.0), small_llama(false)}) {
    SCOPED_TRACE(base.is_llama() ? "llama" : "gpt");
    at::manual_seed(7);
    Decoder whole(base);
    std::map<std::string, std::vector<int64_t>> whole_sizes;
    for (const auto& item : whole.named_parameters()) whole_sizes[item.key()] = item.value().sizes().vec();
    DecoderOptions o = base;
    o.tensor_parallel = 2;
    Decoder part(o);
    std::map<std::string, int> planned_layers_seen;
    for (const LayerSplit& layer : decoder_parallel_plan(o)) planned_layers_seen[layer.layer] = 0;
    for (const auto& item : part.named_parameters()) {
      const std::string& name = item.key();
      const std::vector<int64_t> mine = item.value().sizes().vec(), all = whole_sizes.at(name);
      const LayerSplit layer = layer_split_of(o, name.substr(0, name.rfind('.')));
      if (layer.style != ParallelStyle::kReplicated) ++planned_layers_seen[layer.layer];
      const bool bias = name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
      switch (layer.style) {
        case ParallelStyle::kReplicated:
          EXPECT_EQ(mine, all) << name << ": whole on every rank";
          break;
        case ParallelStyle::kColumnwise:
          EXPECT_EQ(mine[0] * 2, all[0]) << name << ": half of the rows";
          break;
        case ParallelStyle::kRowwise:
          if (bias) {
            EXPECT_EQ(mine, all) << name << ": a row-wise layer's bias whole";
          } else {
            EXPECT_EQ(mine[1] * 2, all[1]) << name << ": half of the columns";
          }
          break;
        case ParallelStyle::kVocabulary:
          EXPECT_EQ(mine[0], o.padded_vocab() / 2) << name << ": half of the padded vocabulary";
          break;
      }
      EXPECT_EQ(decoder_parameter_split(o, name).split(), mine != all) << name;
    }
    for (const auto& [layer, seen] : planned_layers_seen) {
      if (layer == "head.lm_head" && o.tied()) continue;  // the embedding's weight, not a layer of its own
      EXPECT_GT(seen, 0) << layer << ": in the plan, not in the model";
    }
  }
}

TEST(DecoderTensorParallel, AShapeTheGroupCannotSplitIsRefusedNamingBothKeys) {
  DecoderOptions o = small_llama(false);
  o.tensor_parallel = 8;  // 8 heads but 4 key/value heads
  EXPECT_NE(o.problem().find("model.n_kv_heads = 4"), std::string::npos) << o.problem();
  EXPECT_NE(o.problem().find("parallel.tensor_parallel = 8"), std::string::npos) << o.problem();
  o.tensor_parallel = 3;
  EXPECT_NE(o.problem().find("model.n_head = 8"), std::string::npos) << o.problem();
  o = small_llama(false);
  o.tensor_parallel = 2;
  o.sequence_parallel = true;
  o.block_size = 9;
  EXPECT_NE(o.problem().find("model.block_size = 9"), std::string::npos) << o.problem();
}

TEST(DecoderTensorParallel, APaddedVocabularyIsSplitIntoEqualParts) {
  DecoderOptions o = small_llama(false);  // 37 tokens
  o.tensor_parallel = 4;
  EXPECT_EQ(o.padded_vocab(), 40);
  o.tensor_rank = 3;
  EXPECT_EQ(o.vocab_first(), 30);
  EXPECT_EQ(o.vocab_rows_valid(), 7);
  const ParameterSplit s = decoder_parameter_split(o, "embed.wte.weight");
  EXPECT_EQ(s.padding, 3);
  EXPECT_EQ(part_of(at::ones({37, 32}), s).sizes(), at::IntArrayRef({10, 32}));
}

}  // namespace
}  // namespace ht::test

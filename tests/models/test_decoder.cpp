// The decoder (GPT-2 and Llama layouts): parameter counts from the shape alone against the
// published counts of real models and against the built module, the family's MLP width rule,
// the parameter names a checkpoint maps from, and shapes that cannot be built.
#include "models/decoder.h"

#include <gtest/gtest.h>

namespace ht::test {
namespace {

DecoderOptions llama3(int64_t layers, int64_t heads, int64_t kv_heads, int64_t dim, double multiplier,
                      int64_t multiple_of) {
  DecoderOptions o = DecoderOptions::llama(128256, 8192, layers, heads, kv_heads, dim);
  o.ffn_dim_multiplier = multiplier;
  o.multiple_of = multiple_of;
  o.rope_theta = 500000;
  return o;
}

TEST(Decoder, ParameterCountsAreThePublishedOnes) {
  // Hugging Face's counts of the released checkpoints.
  EXPECT_EQ(DecoderOptions::gpt2(50257, 1024, 12, 12, 768, 0.1).parameter_count(), 124439808);  // gpt2
  EXPECT_EQ(DecoderOptions::gpt2(50257, 1024, 24, 16, 1024, 0.1).parameter_count(), 354823168);  // gpt2-medium
  EXPECT_EQ(llama3(32, 32, 8, 4096, 1.3, 1024).parameter_count(), 8030261248);   // Llama-3-8B
  EXPECT_EQ(llama3(80, 64, 8, 8192, 1.3, 4096).parameter_count(), 70553706496);  // Llama-3-70B
  DecoderOptions l1b = llama3(16, 32, 8, 2048, 1.5, 256);
  l1b.tie_embeddings = true;
  EXPECT_EQ(l1b.parameter_count(), 1235814400);  // Llama-3.2-1B
  DecoderOptions l2 = DecoderOptions::llama(32000, 4096, 32, 32, 0, 4096);
  EXPECT_EQ(l2.parameter_count(), 6738415616);  // Llama-2-7b
  // GPT-3 175B (Brown et al. 2020, table 2.1: "175.0B"): 96 layers of 12288, 96 heads, 2048 tokens.
  const double gpt3 = static_cast<double>(DecoderOptions::gpt2(50257, 2048, 96, 96, 12288, 0).parameter_count());
  EXPECT_NEAR(gpt3 / 175.0e9, 1.0, 0.005);
}

TEST(Decoder, MlpWidthFollowsTheFamilysRule) {
  EXPECT_EQ(llama3(32, 32, 8, 4096, 1.3, 1024).mlp_hidden(), 14336);
  EXPECT_EQ(llama3(80, 64, 8, 8192, 1.3, 4096).mlp_hidden(), 28672);
  EXPECT_EQ(DecoderOptions::llama(32000, 4096, 32, 32, 0, 4096).mlp_hidden(), 11008);
  EXPECT_EQ(DecoderOptions::gpt2(50257, 1024, 12, 12, 768, 0).mlp_hidden(), 3072);
}

TEST(Decoder, TheBuiltModuleHasTheCountedParameters) {
  DecoderOptions tied_llama = DecoderOptions::llama(37, 16, 3, 4, 2, 24);
  tied_llama.tie_embeddings = true;
  DecoderOptions wide = DecoderOptions::llama(37, 16, 2, 4, 1, 32);
  wide.ffn_dim_multiplier = 1.3;
  wide.multiple_of = 16;
  for (const DecoderOptions& o : {DecoderOptions::gpt2(17, 8, 2, 2, 16, 0.0), DecoderOptions::llama(37, 16, 3, 4, 4, 24),
                                  tied_llama, wide}) {
    Decoder model(o);
    EXPECT_EQ(model.num_parameters(), o.parameter_count()) << choice_name(o.family);
    EXPECT_EQ(model.blocks().size(), static_cast<size_t>(o.n_layer + 2));
  }
}

TEST(Decoder, ParametersHaveTheDocumentedNames) {
  DecoderOptions o = DecoderOptions::llama(37, 16, 1, 4, 2, 24);
  auto names = [](const Decoder& m) {
    std::vector<std::string> n;
    for (const auto& item : m.named_parameters()) n.push_back(item.key());
    return n;
  };
  EXPECT_EQ(names(Decoder(o)),
            (std::vector<std::string>{"embed.wte.weight", "h0.attn_norm.weight", "h0.attn.wqkv.weight",
                                      "h0.attn.wo.weight", "h0.mlp_norm.weight", "h0.mlp.w13.weight", "h0.mlp.w2.weight",
                                      "head.norm.weight", "head.lm_head.weight"}));
  const std::vector<std::string> gpt = names(Decoder(DecoderOptions::gpt2(17, 8, 1, 2, 16, 0.0)));
  EXPECT_EQ(gpt.size(), 2u + 12u + 2u) << "wte, wpe; 4 norm, 4 attention, 4 MLP tensors; the final norm";
  EXPECT_EQ(gpt[1], "embed.wpe.weight");
  EXPECT_EQ(gpt[3], "h0.attn_norm.bias");
}

TEST(Decoder, KvHeadsShapeTheKeyAndValueProjections) {
  Decoder model(DecoderOptions::llama(37, 16, 1, 8, 2, 32));  // hd 4: q 8 x 4 rows, k and v 2 x 4 each
  EXPECT_EQ(model.named_parameters()["h0.attn.wqkv.weight"].sizes(), at::IntArrayRef({8 * 4 + 2 * 2 * 4, 32}));
}

TEST(Decoder, ImpossibleShapesAreRefusedWithTheKey) {
  EXPECT_NE(DecoderOptions::gpt2(17, 8, 2, 3, 16, 0).problem().find("n_head"), std::string::npos);
  EXPECT_NE(DecoderOptions::llama(17, 8, 2, 4, 3, 16).problem().find("n_kv_heads"), std::string::npos);
  EXPECT_NE(DecoderOptions::llama(17, 8, 2, 4, 0, 12).problem().find("even head dimension"), std::string::npos);
  EXPECT_THROW(Decoder(DecoderOptions::gpt2(17, 8, 2, 3, 16, 0)), c10::Error);
}

// The attention op against attention composed of matmul, softmax and masked_fill (which saves
// the T x T scores): the same loss and gradients, both families, grouped-query heads (float64).
TEST(Decoder, TheAttentionOpTrainsLikeComposedAttention) {
  DecoderOptions tied_llama = DecoderOptions::llama(23, 40, 2, 4, 1, 32);
  tied_llama.tie_embeddings = true;
  for (DecoderOptions o : {DecoderOptions::gpt2(23, 40, 2, 4, 32, 0.0), DecoderOptions::llama(23, 40, 2, 4, 2, 32),
                           tied_llama}) {
    SCOPED_TRACE(choice_name(o.family));
    at::manual_seed(3);
    const at::Tensor x = at::randint(23, {3, 37}, at::kLong), y = at::randint(23, {3, 37}, at::kLong);
    std::vector<std::shared_ptr<Decoder>> models;
    std::vector<at::Tensor> losses;
    for (bool naive : {false, true}) {
      o.naive_attention = naive;
      at::manual_seed(1);
      models.push_back(std::make_shared<Decoder>(o));
      models.back()->move_to(at::kCPU, at::kDouble);
      Interpreter interp;
      Tensor loss = models.back()->loss(models.back()->forward(interp.input(x)), interp.input(y));
      interp.backward(loss);
      losses.push_back(loss.value().detach().clone());
    }
    EXPECT_NEAR(losses[0].item<double>(), losses[1].item<double>(), 1e-12);
    auto naive_params = models[1]->named_parameters();
    for (const auto& item : models[0]->named_parameters()) {
      const double err = (item.value().grad() - naive_params[item.key()].grad()).abs().max().item<double>();
      EXPECT_LT(err, 1e-12) << item.key();
    }
  }
}

TEST(Decoder, RejectsSequencesLongerThanBlockSize) {
  Decoder model(DecoderOptions::llama(17, 8, 1, 2, 0, 16));
  Interpreter interp;
  EXPECT_THROW(model.forward(interp.input(at::zeros({1, 9}, at::kLong))), c10::Error);
}

}  // namespace
}  // namespace ht::test

#include "launcher/model_factory.h"

#include "base/user_error.h"
#include "models/convnet.h"
#include "models/decoder.h"
#include "models/mlp.h"
#include "models/resnet.h"
#include "models/supernet.h"

namespace ht {
namespace {

// (C, H, W) with H == W, or a UserError naming the model.
int64_t square_image_size(const Config& c, const DataInfo& data) {
  const auto& s = data.sample_shape;
  if (s.size() != 3 || s[1] != s[2]) {
    throw UserError(c.source + ": model.name = \"" + choice_name(c.model.name) + "\" needs square images (C, H, W); the data gives " +
                    c10::str(at::IntArrayRef(s)));
  }
  return s[1];
}

}  // namespace

DecoderOptions decoder_options(const ModelConfig& m, int64_t data_vocab) {
  DecoderOptions o = m.name == ModelKind::kLlama
                         ? DecoderOptions::llama(data_vocab, m.block_size, m.n_layer, m.n_head, m.n_kv_heads, m.n_embd)
                         : DecoderOptions::gpt2(data_vocab, m.block_size, m.n_layer, m.n_head, m.n_embd, m.dropout);
  if (m.vocab_size > 0) o.vocab_size = m.vocab_size;
  o.ffn_dim_multiplier = m.ffn_dim_multiplier;
  o.multiple_of = m.multiple_of;
  o.rope_theta = m.rope_theta;
  o.norm_eps = m.norm_eps;
  o.tie_embeddings = m.tie_embeddings;  // GPT-2 ties whatever it says (DecoderOptions::tied)
  o.dropout = m.dropout;
  return o;
}

std::shared_ptr<Model> make_model(const Config& c, const DataInfo& data, int tensor_rank, int context_rank) {
  const ModelConfig& m = c.model;
  if (m.name == ModelKind::kMlp) {
    int64_t features = 1;
    for (int64_t s : data.sample_shape) features *= s;
    return std::make_shared<Mlp>(MlpOptions{features, m.hidden, data.classes, m.dropout});
  }
  if (m.name == ModelKind::kConvnet) {
    const int64_t size = square_image_size(c, data);
    if (size % (int64_t{1} << m.channels.size()) != 0) {
      throw UserError(c.source + ": model.channels has " + std::to_string(m.channels.size()) +
                      " conv blocks, each halving the image, but the images are " + std::to_string(size) +
                      " pixels wide; use at most as many blocks as the size has factors of 2");
    }
    return std::make_shared<ConvNet>(
        ConvNetOptions{data.sample_shape[0], size, m.channels, m.fc_hidden, data.classes, m.dropout});
  }
  if (m.name == ModelKind::kResnet) {
    square_image_size(c, data);
    return std::make_shared<ResNet>(
        ResNetOptions{static_cast<int>(m.depth), m.width, m.stage_blocks, data.sample_shape[0], data.classes, m.small_input});
  }
  if (m.name == ModelKind::kSupernet) {
    const int64_t size = square_image_size(c, data);
    return std::make_shared<Supernet>(SupernetOptions{data.sample_shape[0], size, m.width, m.num_blocks, data.classes});
  }
  TORCH_INTERNAL_ASSERT(is_decoder(m.name), "unknown model ", choice_name(m.name), " passed validation");
  if (m.vocab_size > 0 && m.vocab_size < data.classes) {
    throw UserError(c.source + ": model.vocab_size = " + std::to_string(m.vocab_size) + " is smaller than the data's " +
                    std::to_string(data.classes) + " token ids (" + data.description +
                    "); use at least that, or 0 for the data's");
  }
  DecoderOptions o = decoder_options(m, data.classes);
  o.tensor_parallel = c.parallel.tensor_parallel;
  o.tensor_rank = tensor_rank;
  o.sequence_parallel = c.parallel.sequence_parallel;
  o.context_parallel = c.parallel.context_parallel;
  o.context_exchange = c.parallel.context_exchange;
  o.context_rank = context_rank;
  if (const std::string problem = o.problem(); !problem.empty()) throw UserError(c.source + ": " + problem);
  return std::make_shared<Decoder>(o);
}

}  // namespace ht

#include "launcher/model_factory.h"

#include "launcher/user_error.h"
#include "models/convnet.h"
#include "models/gpt.h"
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

std::shared_ptr<Model> make_model(const Config& c, const DataInfo& data) {
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
  TORCH_INTERNAL_ASSERT(m.name == ModelKind::kGpt, "unknown model ", choice_name(m.name), " passed validation");
  return std::make_shared<Gpt>(GptOptions{data.classes, m.block_size, m.n_layer, m.n_head, m.n_embd, m.dropout});
}

}  // namespace ht

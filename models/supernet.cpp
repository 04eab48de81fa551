#include "models/supernet.h"

namespace ht {
namespace {

// conv -> bn -> relu, with the conv of each candidate kind.
class ConvBnRelu : public torch::nn::Module {
 public:
  ConvBnRelu(int64_t in, int64_t out, int64_t k, int64_t stride, int64_t groups)
      : conv_(register_module("conv", std::make_shared<Conv2d>(in, out, k, stride, k / 2, groups, false))),
        bn_(register_module("bn", std::make_shared<BatchNorm2d>(out))) {}
  Tensor forward(const Tensor& x) { return relu(bn_->forward(conv_->forward(x))); }

 private:
  std::shared_ptr<Conv2d> conv_;
  std::shared_ptr<BatchNorm2d> bn_;
};

class ChoiceBlock : public Block {
 public:
  ChoiceBlock(int64_t channels, int64_t stride) : stride_(stride) {
    conv3_ = register_module("conv3x3", std::make_shared<ConvBnRelu>(channels, channels, 3, stride, 1));
    conv5_ = register_module("conv5x5", std::make_shared<ConvBnRelu>(channels, channels, 5, stride, 1));
    depthwise_ = register_module("sep_dw", std::make_shared<ConvBnRelu>(channels, channels, 3, stride, channels));
    pointwise_ = register_module("sep_pw", std::make_shared<ConvBnRelu>(channels, channels, 1, 1, 1));
  }

  Tensor forward(const Tensor& x) override {  // (B, C, H, W) -> (B, C, H/stride, W/stride)
    last_choice = static_cast<int64_t>(x.interp().next_seed() % Supernet::kCandidates);
    switch (last_choice) {
      case 0: return conv3_->forward(x);
      case 1: return conv5_->forward(x);
      case 2: return pointwise_->forward(depthwise_->forward(x));
      default:  // identity (a strided block pools instead, keeping the shape contract)
        return stride_ == 1 ? x : avg_pool2d(x, {stride_, stride_});
    }
  }

  int64_t last_choice = -1;

 private:
  int64_t stride_;
  std::shared_ptr<ConvBnRelu> conv3_, conv5_, depthwise_, pointwise_;
};

class StemBlock : public Block {
 public:
  StemBlock(int64_t in, int64_t width)
      : stem_(register_module("stem", std::make_shared<ConvBnRelu>(in, width, 3, 1, 1))) {}
  Tensor forward(const Tensor& x) override { return stem_->forward(x); }

 private:
  std::shared_ptr<ConvBnRelu> stem_;
};

class PoolHead : public Block {
 public:
  PoolHead(int64_t channels, int64_t classes)
      : fc_(register_module("fc", std::make_shared<Linear>(channels, classes))) {}
  Tensor forward(const Tensor& x) override {
    return fc_->forward(reshape(adaptive_avg_pool2d(x, {1, 1}), {x.size(0), x.size(1)}));
  }

 private:
  std::shared_ptr<Linear> fc_;
};

}  // namespace

Supernet::Supernet(const SupernetOptions& o) {
  add_block("stem", std::make_shared<StemBlock>(o.in_channels, o.width));
  for (int64_t i = 0; i < o.num_blocks; ++i) {
    const int64_t stride = (i == o.num_blocks / 2 && o.image_size % 2 == 0) ? 2 : 1;
    add_block("choice" + std::to_string(i), std::make_shared<ChoiceBlock>(o.width, stride));
  }
  add_block("head", std::make_shared<PoolHead>(o.width, o.classes));
}

std::vector<int64_t> Supernet::last_choices() const {
  std::vector<int64_t> choices;
  for (const auto& block : blocks()) {
    if (auto* choice = dynamic_cast<const ChoiceBlock*>(block.get())) choices.push_back(choice->last_choice);
  }
  return choices;
}

}  // namespace ht

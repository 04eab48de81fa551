#include "models/resnet.h"

#include <torch/nn/init.h>

#include <functional>

namespace ht {
namespace {

std::shared_ptr<Conv2d> conv(int64_t in, int64_t out, int64_t k, int64_t stride) {
  auto c = std::make_shared<Conv2d>(in, out, k, stride, k / 2, 1, /*bias=*/false);
  at::NoGradGuard no_grad;
  torch::nn::init::kaiming_normal_(c->weight, 0.0, torch::kFanOut, torch::kReLU);
  return c;
}

// conv(stride) -> bn on the shortcut when the shape changes.
class Shortcut : public torch::nn::Module {
 public:
  Shortcut(int64_t in, int64_t out, int64_t stride) {
    if (stride != 1 || in != out) {
      conv_ = register_module("conv", conv(in, out, 1, stride));
      bn_ = register_module("bn", std::make_shared<BatchNorm2d>(out));
    }
  }
  Tensor forward(const Tensor& x) { return conv_ ? bn_->forward(conv_->forward(x)) : x; }

 private:
  std::shared_ptr<Conv2d> conv_;
  std::shared_ptr<BatchNorm2d> bn_;
};

// relu(bn(conv3x3(relu(bn(conv3x3(x))))) + shortcut(x))
class BasicBlock : public Block {
 public:
  static constexpr int64_t kExpansion = 1;
  BasicBlock(int64_t in, int64_t planes, int64_t stride)
      : conv1_(register_module("conv1", conv(in, planes, 3, stride))),
        bn1_(register_module("bn1", std::make_shared<BatchNorm2d>(planes))),
        conv2_(register_module("conv2", conv(planes, planes, 3, 1))),
        bn2_(register_module("bn2", std::make_shared<BatchNorm2d>(planes))),
        shortcut_(register_module("shortcut", std::make_shared<Shortcut>(in, planes, stride))) {}

  Tensor forward(const Tensor& x) override {
    Tensor h = relu(bn1_->forward(conv1_->forward(x)));
    h = bn2_->forward(conv2_->forward(h));
    return relu(add(h, shortcut_->forward(x)));
  }

 private:
  std::shared_ptr<Conv2d> conv1_;
  std::shared_ptr<BatchNorm2d> bn1_;
  std::shared_ptr<Conv2d> conv2_;
  std::shared_ptr<BatchNorm2d> bn2_;
  std::shared_ptr<Shortcut> shortcut_;
};

// conv1x1 -> conv3x3(stride) -> conv1x1(planes x 4), each with bn (relu between), + shortcut
class Bottleneck : public Block {
 public:
  static constexpr int64_t kExpansion = 4;
  Bottleneck(int64_t in, int64_t planes, int64_t stride)
      : conv1_(register_module("conv1", conv(in, planes, 1, 1))),
        bn1_(register_module("bn1", std::make_shared<BatchNorm2d>(planes))),
        conv2_(register_module("conv2", conv(planes, planes, 3, stride))),
        bn2_(register_module("bn2", std::make_shared<BatchNorm2d>(planes))),
        conv3_(register_module("conv3", conv(planes, planes * kExpansion, 1, 1))),
        bn3_(register_module("bn3", std::make_shared<BatchNorm2d>(planes * kExpansion))),
        shortcut_(register_module(
            "shortcut", std::make_shared<Shortcut>(in, planes * kExpansion, stride))) {}

  Tensor forward(const Tensor& x) override {
    Tensor h = relu(bn1_->forward(conv1_->forward(x)));
    h = relu(bn2_->forward(conv2_->forward(h)));
    h = bn3_->forward(conv3_->forward(h));
    return relu(add(h, shortcut_->forward(x)));
  }

 private:
  std::shared_ptr<Conv2d> conv1_;
  std::shared_ptr<BatchNorm2d> bn1_;
  std::shared_ptr<Conv2d> conv2_;
  std::shared_ptr<BatchNorm2d> bn2_;
  std::shared_ptr<Conv2d> conv3_;
  std::shared_ptr<BatchNorm2d> bn3_;
  std::shared_ptr<Shortcut> shortcut_;
};

class Stem : public Block {
 public:
  Stem(int64_t in, int64_t width, bool small_input)
      : conv_(register_module("conv", conv(in, width, small_input ? 3 : 7, small_input ? 1 : 2))),
        bn_(register_module("bn", std::make_shared<BatchNorm2d>(width))),
        small_input_(small_input) {}

  Tensor forward(const Tensor& x) override {
    Tensor h = relu(bn_->forward(conv_->forward(x)));
    return small_input_ ? h : max_pool2d(h, {3, 3}, {2, 2}, {1, 1});
  }

 private:
  std::shared_ptr<Conv2d> conv_;
  std::shared_ptr<BatchNorm2d> bn_;
  bool small_input_;
};

class Head : public Block {
 public:
  Head(int64_t features, int64_t classes)
      : fc_(register_module("fc", std::make_shared<Linear>(features, classes))) {}

  Tensor forward(const Tensor& x) override {  // (B, C, h, w) -> (B, classes)
    return fc_->forward(reshape(adaptive_avg_pool2d(x, {1, 1}), {x.size(0), x.size(1)}));
  }

 private:
  std::shared_ptr<Linear> fc_;
};

template <typename BlockType>
void add_stages(const ResNetOptions& o, const std::vector<int64_t>& stage_blocks,
                const std::function<void(const std::string&, std::shared_ptr<Block>)>& add) {
  int64_t in = o.width;
  for (size_t stage = 0; stage < stage_blocks.size(); ++stage) {
    const int64_t planes = o.width << stage;
    for (int64_t i = 0; i < stage_blocks[stage]; ++i) {
      const int64_t stride = (stage > 0 && i == 0) ? 2 : 1;
      add("layer" + std::to_string(stage + 1) + "_" + std::to_string(i),
          std::make_shared<BlockType>(in, planes, stride));
      in = planes * BlockType::kExpansion;
    }
  }
  add("head", std::make_shared<Head>(in, o.classes));
}

}  // namespace

ResNet::ResNet(const ResNetOptions& o) {
  std::vector<int64_t> blocks = o.stage_blocks;
  if (blocks.empty()) {
    switch (o.depth) {
      case 18: blocks = {2, 2, 2, 2}; break;
      case 34:
      case 50: blocks = {3, 4, 6, 3}; break;
      default: TORCH_CHECK(false, "ResNet: depth must be 18, 34 or 50, got ", o.depth);
    }
  }
  add_block("stem", std::make_shared<Stem>(o.in_channels, o.width, o.small_input));
  auto add = [this](const std::string& name, std::shared_ptr<Block> b) { add_block(name, std::move(b)); };
  if (o.depth == 50) {
    add_stages<Bottleneck>(o, blocks, add);
  } else {
    add_stages<BasicBlock>(o, blocks, add);
  }
}

}  // namespace ht

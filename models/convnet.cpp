#include "models/convnet.h"

namespace ht {
namespace {

class ConvPoolBlock : public Block {
 public:
  ConvPoolBlock(int64_t in, int64_t out)
      : conv_(register_module("conv", std::make_shared<Conv2d>(in, out, 3, 1, 1, 1, false))),
        bn_(register_module("bn", std::make_shared<BatchNorm2d>(out))) {}

  Tensor forward(const Tensor& x) override {  // (B, in, H, W) -> (B, out, H/2, W/2)
    return max_pool2d(relu(bn_->forward(conv_->forward(x))), {2, 2});
  }

 private:
  std::shared_ptr<Conv2d> conv_;
  std::shared_ptr<BatchNorm2d> bn_;
};

class ClassifierBlock : public Block {
 public:
  ClassifierBlock(int64_t in, int64_t hidden, int64_t classes, double dropout)
      : fc1_(register_module("fc1", std::make_shared<Linear>(in, hidden))),
        fc2_(register_module("fc2", std::make_shared<Linear>(hidden, classes))),
        dropout_(dropout) {}

  Tensor forward(const Tensor& x) override {  // (B, C, h, w) -> (B, classes)
    Tensor h = relu(fc1_->forward(reshape(x, {x.size(0), -1})));
    return fc2_->forward(dropout(h, dropout_, is_training()));
  }

 private:
  std::shared_ptr<Linear> fc1_, fc2_;
  double dropout_;
};

}  // namespace

ConvNet::ConvNet(const ConvNetOptions& o) {
  TORCH_CHECK(!o.channels.empty(), "ConvNet: at least one conv block");
  int64_t in = o.in_channels, size = o.image_size;
  for (size_t i = 0; i < o.channels.size(); ++i) {
    TORCH_CHECK(size % 2 == 0, "ConvNet: image size ", o.image_size, " is not divisible by 2^",
                o.channels.size());
    add_block("conv" + std::to_string(i), std::make_shared<ConvPoolBlock>(in, o.channels[i]));
    in = o.channels[i];
    size /= 2;
  }
  add_block("classifier",
            std::make_shared<ClassifierBlock>(in * size * size, o.hidden, o.classes, o.dropout));
}

}  // namespace ht

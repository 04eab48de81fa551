#include "models/mlp.h"

namespace ht {
namespace {

class DenseBlock : public Block {
 public:
  DenseBlock(int64_t in, int64_t out, bool activation, double dropout)
      : linear_(register_module("linear", std::make_shared<Linear>(in, out))),
        activation_(activation), dropout_(dropout) {}

  Tensor forward(const Tensor& x) override {
    const int64_t in = linear_->weight.size(1);
    Tensor h = linear_->forward(x.dim() == 2 ? x : reshape(x, {x.size(0), in}));
    if (!activation_) return h;
    return dropout(relu(h), dropout_, is_training());
  }

 private:
  std::shared_ptr<Linear> linear_;
  bool activation_;
  double dropout_;
};

}  // namespace

Mlp::Mlp(const MlpOptions& o) {
  int64_t width = o.in_features;
  for (size_t i = 0; i < o.hidden.size(); ++i) {
    add_block("hidden" + std::to_string(i),
              std::make_shared<DenseBlock>(width, o.hidden[i], true, o.dropout));
    width = o.hidden[i];
  }
  add_block("head", std::make_shared<DenseBlock>(width, o.classes, false, 0.0));
}

}  // namespace ht

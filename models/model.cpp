#include "models/model.h"

#include <unordered_map>

namespace ht {

Tensor Model::forward(const Tensor& input) {
  TORCH_CHECK(!blocks_.empty(), "Model::forward: the model has no blocks");
  Tensor x = input;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    if (block_listener_) block_listener_(static_cast<int>(i));
    x = blocks_[i]->forward(x);
  }
  if (block_listener_) block_listener_(-1);
  return x;
}

Tensor Model::loss(const Tensor& output, const Tensor& target) {
  return cross_entropy(output, target);
}

int64_t Model::num_parameters() const {
  int64_t n = 0;
  for (const at::Tensor& p : parameters()) n += p.numel();
  return n;
}

std::vector<int> Model::parameter_blocks() const {
  std::unordered_map<const c10::TensorImpl*, int> block_of;
  for (size_t b = 0; b < blocks_.size(); ++b) {
    for (const at::Tensor& p : blocks_[b]->parameters()) block_of.emplace(p.unsafeGetTensorImpl(), static_cast<int>(b));
  }
  std::vector<int> out;
  for (const at::Tensor& p : parameters()) {
    auto it = block_of.find(p.unsafeGetTensorImpl());
    out.push_back(it == block_of.end() ? -1 : it->second);
  }
  return out;
}

std::vector<std::vector<at::Tensor>> Model::parameters_read_by_blocks() const {
  std::vector<std::vector<at::Tensor>> out;
  for (const auto& block : blocks_) {
    out.push_back(block->parameters());
    for (const at::Tensor& tied : block->shared_parameters()) out.back().push_back(tied);
  }
  return out;
}

void Model::move_to(const at::Device& device, at::ScalarType float_dtype) {
  at::NoGradGuard no_grad;
  for (at::Tensor& t : parameters()) t.set_data(t.to(device, float_dtype));
  for (at::Tensor& t : buffers()) {
    t.set_data(t.is_floating_point() ? t.to(device, float_dtype) : t.to(device));
  }
}

int Model::use_channels_last() {
  at::NoGradGuard no_grad;
  int restrided = 0;
  for (at::Tensor& t : parameters()) {
    // Restrided always: contiguous() would keep a weight of one input channel as it is (its
    // NCHW strides already count as channels-last), and ATen's convolution would then choose
    // NCHW for the first layer of a grayscale model, and batch norm and pooling after it.
    if (t.dim() != 4) continue;
    t.set_data(at::empty_like(t, at::MemoryFormat::ChannelsLast).copy_(t));
    ++restrided;
  }
  return restrided;
}

void Model::add_block(const std::string& name, std::shared_ptr<Block> block) {
  blocks_.push_back(register_module(name, std::move(block)));
  block_names_.push_back(name);
}

}  // namespace ht

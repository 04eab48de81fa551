// ModelState: a tensor-parallel rank's whole tensors. Each rank of a group holds its parts of the
// split parameters (models/decoder_split.h) and the whole of the replicated ones; a whole
// checkpoint (model.pt) is read into the whole tensors, gathered for the moment it takes.
#include "training/model_state.h"

#include "alloc/cpu_device_allocator.h"
#include "models/decoder.h"
#include "models/decoder_split.h"

namespace ht {

void ModelState::with_whole_tensors(const std::function<void()>& fn) {
  const auto* decoder = dynamic_cast<const Decoder*>(&model_);
  TORCH_INTERNAL_ASSERT(decoder != nullptr && groups_.tensor() != nullptr, "with_whole_tensors: a decoder split across a group");
  const DecoderOptions& options = decoder->options();
  TensorGroup& tensor = *groups_.tensor();
  const int t = tensor.size();
  at::NoGradGuard no_grad;
  // Every rank's part of `part` (same shape on each), whole.
  auto gathered = [&](const std::string& name, const at::Tensor& part) {
    HostAllocationScope host;  // the whole lives on the host for the moment it is needed
    const at::Tensor dense = part.contiguous();
    at::Tensor buffer = at::empty({t * dense.numel()}, dense.options());
    tensor.all_gather(dense.view(-1), buffer, "a checkpoint's whole tensors");
    std::vector<at::Tensor> parts;
    for (int r = 0; r < t; ++r) parts.push_back(buffer.narrow(0, r * dense.numel(), dense.numel()).view(dense.sizes()));
    return whole_of(options, name, parts);
  };
  // The parts' own tensors are kept and written back into: under a budget they lie in the
  // arena's blocks (compact_parameters, compact_optimizer_state), which must stay as they are.
  struct Held {
    at::Tensor param;
    ParameterSplit split;
    at::Tensor part;                // the parameter's part, its storage
    std::vector<at::Tensor> state;  // the optimizer state's parts (empty: none yet)
  };
  std::vector<Held> held;
  for (const auto& item : model_.named_parameters()) {
    const ParameterSplit split = decoder_parameter_split(options, item.key());
    if (!split.split()) continue;
    at::Tensor param = item.value();
    Held h{param, split, param.detach(), optimizer_state(optimizer(), param)};
    std::vector<at::Tensor> whole = h.state;
    for (at::Tensor& s : whole)
      if (s.dim() > 0) s = gathered(item.key(), s);
    param.set_data(gathered(item.key(), param));
    if (!whole.empty()) set_optimizer_state(optimizer(), param, whole);
    held.push_back(std::move(h));
  }
  struct Parts {  // this rank's parts again, also when fn throws
    std::vector<Held>& held;
    torch::optim::Optimizer& optimizer;
    ~Parts() {
      for (Held& h : held) {
        auto part_on_host = [&](const at::Tensor& whole) {  // a temporary, outside the budget
          HostAllocationScope host;
          return part_of(whole, h.split);
        };
        std::vector<at::Tensor> whole = optimizer_state(optimizer, h.param);  // read back, or kept
        std::vector<at::Tensor> parts = h.state;
        if (parts.size() != whole.size()) parts.assign(whole.size(), at::Tensor());  // none before: new tensors
        for (size_t k = 0; k < whole.size(); ++k) {
          if (whole[k].dim() == 0) {
            parts[k] = whole[k];  // AdamW's step
          } else if (parts[k].defined()) {
            parts[k].copy_(part_on_host(whole[k]));
          } else {
            parts[k] = part_on_host(whole[k]).clone();  // device memory
          }
        }
        h.part.copy_(part_on_host(h.param));
        h.param.set_data(h.part);
        if (!whole.empty()) set_optimizer_state(optimizer, h.param, parts);
      }
    }
  } parts{held, optimizer()};
  fn();
}

}  // namespace ht

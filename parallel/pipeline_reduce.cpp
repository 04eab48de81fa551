// What a pipeline's stages combine once per step (tied gradients, the gradient norms, the loss),
// and what each keeps of the model. Messages here are few and small beside the activations, so
// they are blocking (on a GPU, for the stream: what is queued next follows them), in an order
// every rank derives from the model alone.
#include "parallel/pipeline_stage.h"

#include "alloc/gradient_buffer.h"

#include <unordered_set>

namespace ht {
namespace {

constexpr int kTiedTag = (1 << 14) + 1;

}  // namespace

void PipelineStage::sum_tied_gradients() {
  at::NoGradGuard no_grad;
  for (const TiedParameter& t : tied_) {
    if (t.owner != rank() && t.user != rank()) continue;
    const int other = t.owner == rank() ? t.user : t.owner;
    at::Tensor mine = t.param.grad().defined()
                          ? t.param.grad().contiguous()
                          : at::zeros_like(t.param, t.param.options().dtype(gradient_type_of(t.param, floating_)));
    at::Tensor theirs = at::empty_like(mine);
    // One group: on a backend that matches in posting order a lone send would wait for the other
    // stage's receive, posted after its own send.
    std::vector<PeerMessage> exchange;
    exchange.push_back({true, mine, other, kTiedTag, "a tied weight's gradient"});
    exchange.push_back({false, theirs, other, kTiedTag, "a tied weight's gradient"});
    pipeline_->post_group(std::move(exchange))->wait();
    // The owner's part first on both ranks: the same sum, bit for bit.
    const at::Tensor sum = t.owner == rank() ? mine + theirs : theirs + mine;
    at::Tensor param = t.param;
    if (param.grad().defined()) {
      param.mutable_grad().copy_(sum);
    } else {
      param.mutable_grad() = sum;
    }
  }
}

bool PipelineStage::holds_tied_copy(const at::Tensor& param) const {
  for (const TiedParameter& t : tied_)
    if (t.user == rank() && t.param.is_same(param)) return true;
  return false;
}

at::Tensor PipelineStage::gradient_norms() {
  // Each parameter's norm on the rank that owns it, in model order, then combined as one rank
  // combines them: the same numbers in the same order give the same bits.
  const std::vector<at::Tensor> params = model_.parameters();
  const std::vector<int> owner = parameter_owners(model_, layout_);
  const int64_t n = static_cast<int64_t>(params.size());
  at::Tensor gathered = at::zeros({2, n}, at::kDouble);  // row 0: norms, row 1: 1 where defined
  for (int64_t i = 0; i < n; ++i) {
    const at::Tensor& p = params[static_cast<size_t>(i)];
    if (owner[static_cast<size_t>(i)] != rank() || !p.grad().defined()) continue;
    gathered[0][i] = gradient_norm(p.grad()).to(at::kDouble).item<double>();
    gathered[1][i] = 1.0;
  }
  pipeline_->allreduce_sum(gathered, "the gradient norms");
  std::vector<double> norms;
  for (int64_t i = 0; i < n; ++i)
    if (gathered[1][i].item<double>() > 0) norms.push_back(gathered[0][i].item<double>());
  return at::tensor(norms, at::kDouble);
}

bool PipelineStage::all_stages(bool finite) {
  at::Tensor bad = at::scalar_tensor(finite ? 0.0 : 1.0, at::kDouble).reshape({1});
  pipeline_->allreduce_sum(bad, "whether the gradients are finite");
  return bad.item<double>() == 0.0;
}

void PipelineStage::sum(at::Tensor& value, const char* what) {
  pipeline_->allreduce_sum(value, what);
}

void PipelineStage::keep_only_own(Model& model) {
  at::NoGradGuard no_grad;
  std::unordered_set<const void*> mine;
  for (const at::Tensor& p : params_) mine.insert(p.unsafeGetTensorImpl());
  const std::vector<int> buffer_owner = buffer_owners(model, layout_);
  auto keep = [](at::Tensor t, bool own) {
    // set_data keeps the TensorImpl: the modules, the tied copy and the optimizer still hold it.
    t.set_data(own ? t.detach().clone(at::MemoryFormat::Preserve) : at::empty({0}, t.options()));
  };
  for (const at::Tensor& p : model.parameters()) {
    model_parameters_ += p.numel();
    share_.param_sizes.emplace_back(p.sizes().begin(), p.sizes().end());
    share_.own_param.push_back(mine.count(p.unsafeGetTensorImpl()) > 0);
    keep(p, share_.own_param.back());
  }
  const std::vector<at::Tensor> buffers = model.buffers();
  for (size_t i = 0; i < buffers.size(); ++i) {
    share_.buffer_sizes.emplace_back(buffers[i].sizes().begin(), buffers[i].sizes().end());
    share_.own_buffer.push_back(buffer_owner[i] == rank());
    keep(buffers[i], share_.own_buffer.back());
  }
}

}  // namespace ht

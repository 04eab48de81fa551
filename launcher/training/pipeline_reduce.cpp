// What a pipeline's stages combine once per step (tied gradients, the gradient norm, the loss)
// and before a checkpoint (everything, on rank 0). Messages here are few and small beside the
// activations, so they are blocking, in an order every rank derives from the model alone.
#include "launcher/training/optimizer.h"
#include "launcher/training/pipeline_stage.h"
#include "alloc/cpu_device_allocator.h"

#include <unordered_set>

namespace ht {
namespace {

void send_now(Communicator& group, const at::Tensor& t, int to, int tag, const std::string& what) {
  group.isend(t.contiguous(), to, tag, what)->wait();
}

void receive_now(Communicator& group, at::Tensor& t, int from, int tag, const std::string& what) {
  group.irecv(t, from, tag, what)->wait();
}

constexpr int kTiedTag = (1 << 14) + 1;
constexpr int kGatherTag = (1 << 14) + 2;

}  // namespace

void PipelineStage::sum_tied_gradients() {
  at::NoGradGuard no_grad;
  for (const TiedParameter& t : tied_) {
    if (t.owner != rank() && t.user != rank()) continue;
    const int other = t.owner == rank() ? t.user : t.owner;
    at::Tensor mine = t.param.grad().defined() ? t.param.grad().contiguous() : at::zeros_like(t.param);
    at::Tensor theirs = at::empty_like(mine);
    auto sent = pipeline_->isend(mine, other, kTiedTag, "a tied weight's gradient");
    auto received = pipeline_->irecv(theirs, other, kTiedTag, "a tied weight's gradient");
    sent->wait();
    received->wait();
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

double PipelineStage::gradient_norm() {
  // Each parameter's norm on the rank that owns it, in model order, then combined as one rank
  // combines them: the same numbers in the same order give the same bits.
  const std::vector<at::Tensor> params = model_.parameters();
  const std::vector<int> owner = parameter_owners(model_, layout_);
  const int64_t n = static_cast<int64_t>(params.size());
  at::Tensor gathered = at::zeros({2, n}, at::kDouble);  // row 0: norms, row 1: 1 where defined
  for (int64_t i = 0; i < n; ++i) {
    const at::Tensor& p = params[static_cast<size_t>(i)];
    if (owner[static_cast<size_t>(i)] != rank() || !p.grad().defined()) continue;
    gathered[0][i] = p.grad().norm().to(at::kDouble).item<double>();
    gathered[1][i] = 1.0;
  }
  pipeline_->allreduce_sum(gathered, "the gradient norms");
  std::vector<double> norms;
  for (int64_t i = 0; i < n; ++i)
    if (gathered[1][i].item<double>() > 0) norms.push_back(gathered[0][i].item<double>());
  return combine_norms(at::tensor(norms, at::kDouble));
}

bool PipelineStage::all_stages(bool finite) {
  at::Tensor bad = at::scalar_tensor(finite ? 0.0 : 1.0, at::kDouble).reshape({1});
  pipeline_->allreduce_sum(bad, "whether the gradients are finite");
  return bad.item<double>() == 0.0;
}

double PipelineStage::sum(double value, const char* what) {
  at::Tensor t = at::scalar_tensor(value, at::kDouble).reshape({1});
  pipeline_->allreduce_sum(t, what);
  return t.item<double>();
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
    full_param_sizes_.emplace_back(p.sizes().begin(), p.sizes().end());
    own_param_.push_back(mine.count(p.unsafeGetTensorImpl()) > 0);
    keep(p, own_param_.back());
  }
  const std::vector<at::Tensor> buffers = model.buffers();
  for (size_t i = 0; i < buffers.size(); ++i) {
    full_buffer_sizes_.emplace_back(buffers[i].sizes().begin(), buffers[i].sizes().end());
    own_buffer_.push_back(buffer_owner[i] == rank());
    keep(buffers[i], own_buffer_.back());
  }
}

void PipelineStage::with_full_model(Model& model, torch::optim::Optimizer& optimizer, const std::function<void()>& fn) {
  at::NoGradGuard no_grad;
  const std::vector<at::Tensor> params = model.parameters(), buffers = model.buffers();
  {
    HostAllocationScope host;  // the other stages' tensors are not this stage's device memory
    for (size_t i = 0; i < params.size(); ++i)
      if (!own_param_[i]) at::Tensor(params[i]).set_data(at::zeros(full_param_sizes_[i], params[i].options()));
    for (size_t i = 0; i < buffers.size(); ++i)
      if (!own_buffer_[i]) at::Tensor(buffers[i]).set_data(at::zeros(full_buffer_sizes_[i], buffers[i].options()));
  }
  struct Empty {  // also when fn throws
    PipelineStage& stage;
    const std::vector<at::Tensor>& params;
    const std::vector<at::Tensor>& buffers;
    torch::optim::Optimizer& optimizer;
    ~Empty() {
      for (size_t i = 0; i < params.size(); ++i) {
        if (stage.own_param_[i]) continue;
        at::Tensor(params[i]).set_data(at::empty({0}, params[i].options()));
        drop_optimizer_state(optimizer, params[i]);
      }
      for (size_t i = 0; i < buffers.size(); ++i)
        if (!stage.own_buffer_[i]) at::Tensor(buffers[i]).set_data(at::empty({0}, buffers[i].options()));
    }
  } empty{*this, params, buffers, optimizer};
  fn();
}

void PipelineStage::gather_to_first_stage(Model& model, torch::optim::Optimizer& optimizer) {
  at::NoGradGuard no_grad;
  const std::vector<at::Tensor> params = model.parameters();
  const std::vector<int> owner = parameter_owners(model, layout_);
  for (size_t i = 0; i < params.size(); ++i) {
    const int from = owner[i];
    if (from == 0 || (rank() != 0 && rank() != from)) continue;
    at::Tensor p = params[i];
    if (rank() == from) {
      send_now(*pipeline_, p, 0, kGatherTag, "a parameter for the checkpoint");
      std::vector<at::Tensor> state = optimizer_state(optimizer, p);
      send_now(*pipeline_, at::scalar_tensor(static_cast<int64_t>(state.size()), at::kLong), 0, kGatherTag,
               "an optimizer state for the checkpoint");
      for (const at::Tensor& s : state) send_now(*pipeline_, s, 0, kGatherTag, "an optimizer state for the checkpoint");
      continue;
    }
    at::Tensor value = at::empty_like(p, at::MemoryFormat::Contiguous);
    receive_now(*pipeline_, value, from, kGatherTag, "a parameter for the checkpoint");
    p.copy_(value);
    at::Tensor count = at::scalar_tensor(0, at::kLong);
    receive_now(*pipeline_, count, from, kGatherTag, "an optimizer state for the checkpoint");
    if (count.item<int64_t>() == 0) continue;
    std::vector<at::Tensor> state = empty_optimizer_state(optimizer, p);
    TORCH_CHECK(static_cast<int64_t>(state.size()) == count.item<int64_t>(), "pipeline: optimizer states differ");
    for (at::Tensor& s : state) {
      s = s.contiguous();
      receive_now(*pipeline_, s, from, kGatherTag, "an optimizer state for the checkpoint");
    }
    set_optimizer_state(optimizer, p, state);
  }
  const std::vector<at::Tensor> buffers = model.buffers();
  const std::vector<int> buffer_owner = buffer_owners(model, layout_);
  for (size_t i = 0; i < buffers.size(); ++i) {
    const int from = buffer_owner[i];
    if (from == 0 || (rank() != 0 && rank() != from)) continue;
    at::Tensor b = buffers[i];
    if (rank() == from) {
      send_now(*pipeline_, b, 0, kGatherTag, "a buffer for the checkpoint");
    } else {
      at::Tensor value = at::empty_like(b, at::MemoryFormat::Contiguous);
      receive_now(*pipeline_, value, from, kGatherTag, "a buffer for the checkpoint");
      b.copy_(value);
    }
  }
}

}  // namespace ht

#include "training/optimizer.h"

#include "alloc/cpu_device_allocator.h"
#include "alloc/gradient_buffer.h"

#include "training/compact.h"
#include "training/fused_optimizer.h"
#include "training/optimizer_state_key.h"

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <map>
#include <sstream>
#include <type_traits>

namespace ht {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerOptions& o,
                                                        const std::vector<at::Tensor>& params) {
  if (o.kind == OptimizerKind::kAdamw) {
    auto adamw = std::make_unique<FusedAdamW>(
        params, torch::optim::AdamWOptions(o.lr).betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(o.weight_decay));
    adamw->set_state_dtype(o.state_dtype == StateDtype::kBf16 ? at::kBFloat16 : at::kFloat);
    return adamw;
  }
  return std::make_unique<FusedSgd>(params, torch::optim::SGDOptions(o.lr).momentum(o.momentum).weight_decay(o.weight_decay));
}

double learning_rate_at(const OptimizerOptions& t, int64_t step, int64_t total_steps) {
  if (step < t.warmup_steps) {
    return t.lr * static_cast<double>(step + 1) / static_cast<double>(t.warmup_steps);
  }
  if (t.schedule == LrSchedule::kConstant) return t.lr;
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - t.warmup_steps - 1);
  const double progress =
      std::min(1.0, static_cast<double>(step - t.warmup_steps) / static_cast<double>(decay_steps));
  return t.min_lr + 0.5 * (t.lr - t.min_lr) * (1.0 + std::cos(M_PI * progress));
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

at::Tensor gradient_norms(const std::vector<at::Tensor>& params) {
  at::NoGradGuard no_grad;
  // Each tensor's norm in its own type (ATen sums floats pairwise, so the error stays near fp32's
  // epsilon), combined in double. Converting every gradient to double first cost a copy of the
  // model in double each step: 17 ms of a 600 ms ResNet-18 step on one core.
  std::vector<at::Tensor> norms;  // on the device: one synchronization for the whole model
  for (const at::Tensor& p : params) {
    if (p.grad().defined()) norms.push_back(gradient_norm(p.grad()).to(at::kDouble));
  }
  if (norms.empty()) return at::empty({0}, at::kDouble);
  return at::stack(norms);
}

at::Tensor combine_norms(const at::Tensor& norms) {
  return norms.numel() == 0 ? at::zeros({}, at::kDouble) : norms.norm();
}

at::Tensor clip_coefficient(double max_norm, const at::Tensor& norm) {
  if (max_norm <= 0.0) return {};
  at::NoGradGuard no_grad;
  const at::Tensor shifted = norm + 1e-6;
  return at::where(norm > max_norm, at::full_like(shifted, max_norm) / shifted, at::ones_like(shifted));
}

namespace {

// Every gradient multiplied by the coefficient (undefined: left alone), as torch::optim's steps
// read them; a coefficient on the CPU is read (nothing to wait for), one on a GPU multiplies there
// (GradientScale: as by the number, in place).
void clip_gradients(const std::vector<at::Tensor>& params, const at::Tensor& coefficient) {
  if (!coefficient.defined()) return;
  at::NoGradGuard no_grad;
  const double host = coefficient.is_cpu() ? coefficient.item<double>() : 1.0;
  if (coefficient.is_cpu() && host == 1.0) return;
  for (const at::Tensor& p : params) {
    if (!p.grad().defined()) continue;
    if (coefficient.is_cpu()) {
      p.mutable_grad().mul_(host);
    } else {
      GradientScale{1.0, coefficient}.applied_to(p.mutable_grad());
    }
  }
}

// A CPU rank's norm, and the coefficient made from it, are host memory, not its arena's: the
// update's peak holds no block the planner's trace of it frees (launcher/planning/meta_trace.cpp).
at::Tensor beside_the_update(const at::Tensor& norm) {
  if (!norm.is_cpu()) return norm;
  HostAllocationScope host;
  return norm.clone();
}

}  // namespace

double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm) {
  const at::Tensor norm = combine_norms(gradient_norms(params));
  clip_gradients(params, clip_coefficient(max_norm, norm));
  return norm.item<double>();
}

StepOutcome optimizer_step(torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& params,
                           const OptimizerOptions& t, double lr, LossScaler* scaler, const StepAcrossStages& stages) {
  StepOutcome outcome;
  if (scaler != nullptr) {
    outcome.stepped = scaler->unscale(params);
    if (stages.all_finite) outcome.stepped = stages.all_finite(outcome.stepped);
    scaler->update(outcome.stepped);
  }
  outcome.grad_norm =
      beside_the_update(stages.gradient_norm ? stages.gradient_norm() : combine_norms(gradient_norms(params)));
  if (!outcome.stepped) return outcome;
  // A fused step applies the clipping coefficient as it reads each gradient (the same bits as
  // scaling them first, without that pass); torch::optim's steps read them scaled.
  at::Tensor coefficient;
  {
    const HostAllocationScope host(outcome.grad_norm.is_cpu());
    coefficient = clip_coefficient(t.grad_clip, outcome.grad_norm);
  }
  if (auto* fused = dynamic_cast<FusedStep*>(&optimizer)) {
    fused->set_gradient_scale(coefficient);
  } else {
    clip_gradients(params, coefficient);
  }
  set_learning_rate(optimizer, lr);
  optimizer.step();
  return outcome;
}

namespace {

torch::optim::OptimizerParamState* find_state(torch::optim::Optimizer& optimizer, const at::Tensor& param) {
  auto& states = optimizer.state();
  using Key = typename std::decay_t<decltype(states)>::key_type;
  auto it = states.find(state_key<Key>(param));
  return it == states.end() ? nullptr : it->second.get();
}

}  // namespace

std::vector<at::Tensor> optimizer_state(torch::optim::Optimizer& optimizer, const at::Tensor& param) {
  torch::optim::OptimizerParamState* state = find_state(optimizer, param);
  if (state == nullptr) return {};
  if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(state)) {
    return {at::scalar_tensor(adamw->step(), at::kLong), adamw->exp_avg(), adamw->exp_avg_sq()};
  }
  auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(state);
  if (sgd != nullptr && sgd->momentum_buffer().defined()) return {sgd->momentum_buffer()};
  return {};
}

std::string optimizer_name(const torch::optim::Optimizer& optimizer) {
  return dynamic_cast<const torch::optim::AdamW*>(&optimizer) != nullptr ? "adamw" : "sgd";
}

namespace {

// The type AdamW keeps `param`'s moments in (training.optimizer_state_dtype; a parameter that is
// not fp32 keeps them in its own).
at::ScalarType moment_dtype(const torch::optim::Optimizer& optimizer, const at::Tensor& param) {
  const auto* fused = dynamic_cast<const FusedAdamW*>(&optimizer);
  return fused != nullptr && param.scalar_type() == at::kFloat ? fused->state_dtype() : param.scalar_type();
}

}  // namespace

std::vector<at::Tensor> empty_optimizer_state(const torch::optim::Optimizer& optimizer, const at::Tensor& param) {
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer) != nullptr) {
    const at::ScalarType moments = moment_dtype(optimizer, param);
    return {at::scalar_tensor(0, at::kLong), at::empty_like(param, param.options().dtype(moments)),
            at::empty_like(param, param.options().dtype(moments))};
  }
  return {at::empty_like(param)};
}

void keep_moments_in_their_dtype(torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<const FusedAdamW*>(&optimizer) == nullptr) return;
  for (const auto& group : optimizer.param_groups()) {
    for (const at::Tensor& p : group.params()) {
      auto* s = dynamic_cast<torch::optim::AdamWParamState*>(find_state(optimizer, p));
      if (s == nullptr) continue;
      const at::ScalarType moments = moment_dtype(optimizer, p);
      if (s->exp_avg().scalar_type() != moments) s->exp_avg(s->exp_avg().to(moments));
      if (s->exp_avg_sq().scalar_type() != moments) s->exp_avg_sq(s->exp_avg_sq().to(moments));
    }
  }
}

void set_optimizer_state(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                         const std::vector<at::Tensor>& state) {
  auto& states = optimizer.state();
  using Key = typename std::decay_t<decltype(states)>::key_type;
  if (dynamic_cast<torch::optim::AdamW*>(&optimizer) != nullptr) {
    auto s = std::make_unique<torch::optim::AdamWParamState>();
    s->step(state.at(0).item<int64_t>());
    // A checkpoint's moments may be in the other type: held from here in the configured one, so
    // that what this rank holds, sends and saves is what it was told to keep.
    // (torch::optim's own AdamW, the host copy a checkpoint is written from, keeps what it is given.)
    const bool fused = dynamic_cast<const FusedAdamW*>(&optimizer) != nullptr;
    const at::ScalarType moments = fused ? moment_dtype(optimizer, param) : state.at(1).scalar_type();
    s->exp_avg(state.at(1).to(moments));
    s->exp_avg_sq(state.at(2).to(moments));
    states[state_key<Key>(param)] = std::move(s);
    return;
  }
  auto s = std::make_unique<torch::optim::SGDParamState>();
  s->momentum_buffer(state.at(0));
  states[state_key<Key>(param)] = std::move(s);
}

std::unique_ptr<torch::optim::Optimizer> host_copy_of(torch::optim::Optimizer& optimizer) {
  TORCH_CHECK(optimizer.param_groups().size() == 1, "host_copy_of: ", optimizer.param_groups().size(),
              " parameter groups");
  const torch::optim::OptimizerParamGroup& group = optimizer.param_groups()[0];
  auto host = [](const at::Tensor& t) { return t.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true); };
  // optimizer.save writes a parameter's place in the group, never its values: each stands for
  // one with an empty tensor of its own.
  std::vector<at::Tensor> params;
  for (size_t i = 0; i < group.params().size(); ++i) params.push_back(at::empty({0}, at::kFloat));
  std::unique_ptr<torch::optim::Optimizer> copy;
  if (dynamic_cast<torch::optim::AdamW*>(&optimizer) != nullptr) {
    copy = std::make_unique<torch::optim::AdamW>(params, static_cast<const torch::optim::AdamWOptions&>(group.options()));
  } else {
    copy = std::make_unique<torch::optim::SGD>(params, static_cast<const torch::optim::SGDOptions&>(group.options()));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    std::vector<at::Tensor> state = optimizer_state(optimizer, group.params()[i]);
    if (state.empty()) continue;  // never stepped
    for (at::Tensor& t : state) t = host(t);
    set_optimizer_state(*copy, params[i], state);
  }
  return copy;
}

bool move_optimizer_state(torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& params,
                          const std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>& move) {
  std::vector<std::vector<at::Tensor>> states;
  std::vector<at::Tensor> moving;
  for (const at::Tensor& p : params) {
    states.push_back(optimizer_state(optimizer, p));
    for (const at::Tensor& t : states.back()) {
      if (t.dim() > 0 && t.numel() > 0) moving.push_back(t);
    }
  }
  if (moving.empty()) return false;  // no state yet: the optimizer has not stepped
  const std::vector<at::Tensor> replacements = move(moving);
  TORCH_INTERNAL_ASSERT(replacements.size() == moving.size(), "move_optimizer_state: ", replacements.size(),
                        " tensors for ", moving.size());
  moving.clear();
  size_t k = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    if (states[i].empty()) continue;
    std::vector<at::Tensor> state = std::move(states[i]);
    for (at::Tensor& t : state) {
      if (t.dim() > 0 && t.numel() > 0) t = replacements[k++];
    }
    set_optimizer_state(optimizer, params[i], state);
  }
  return true;
}

bool compact_optimizer_state(torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& params) {
  at::Device device = at::kCPU;
  // To host first: the old device tensors go before the block is allocated, so it lands where they were.
  const bool moved = move_optimizer_state(optimizer, params, [&](const std::vector<at::Tensor>& state) {
    device = state.front().device();
    return copies_on_host(state);
  });
  if (!moved) return false;
  move_optimizer_state(optimizer, params, [&](const std::vector<at::Tensor>& host) { return back_on_device(host, device); });
  return true;
}

void drop_optimizer_state(torch::optim::Optimizer& optimizer, const at::Tensor& param) {
  auto& states = optimizer.state();
  using Key = typename std::decay_t<decltype(states)>::key_type;
  states.erase(state_key<Key>(param));
}

void clear_grads(const std::vector<at::Tensor>& params) {
  for (const at::Tensor& p : params) {
    at::Tensor handle = p;  // shares the TensorImpl: resets the parameter's own gradient
    handle.mutable_grad() = at::Tensor();
  }
}

}  // namespace ht

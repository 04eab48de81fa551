// The fused passes (training/fused_optimizer.h). Compiled with -ffp-contract=off and
// -fno-math-errno (training/CMakeLists.txt): no multiply-add is fused unless written as std::fma,
// where libtorch's kernel fuses it, and sqrt vectorizes. Each pass is cloned for AVX-512, for
// AVX2 with FMA and for the baseline, and the loader picks the clone this CPU runs.
#include "training/fused_optimizer.h"

#include "training/optimizer_state_key.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

// target_clones with arch= levels: GCC 12 and later.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define HT_FUSED_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#define HT_FUSED_CLONED 1
#else
#define HT_FUSED_CLONES
#define HT_FUSED_CLONED 0
#endif

namespace ht {
namespace {

// Elements per thread's share: as ATen's pointwise kernels split their work.
constexpr int64_t kGrain = 32768;

// One AdamW step's scalars, each rounded to fp32 as libtorch's kernels round their Scalar arguments.
struct AdamWScalars {
  float grad_scale = 1;  // the clipping coefficient (1: none)
  float decay = 1;       // 1 - lr * weight_decay (1: none; p * 1 is p)
  float beta1 = 0, one_minus_beta1 = 0, beta2 = 0, one_minus_beta2 = 0;
  float bias2_sqrt = 1;  // sqrt(1 - beta2^step), taken in double
  float eps = 0;
  float neg_step = 0;    // -lr / (1 - beta1^step)
};

// libtorch 1.13's AdamW, kernel by kernel:
//   p.mul_(1 - lr wd)                           p * decay
//   exp_avg.mul_(b1).add_(g, 1 - b1)            ATen's add: fmadd(g, alpha, m b1)
//   exp_avg_sq.mul_(b2).addcmul_(g, g, 1 - b2)  v b2 + ((1 - b2) g) g, the last add contracted
//   denom = (exp_avg_sq.sqrt() / sqrt(bc2)).add_(eps)
//   p.addcdiv_(exp_avg, denom, -step)           p + (-step m) / denom
HT_FUSED_CLONES void adamw_pass(float* p, const float* g, float* m, float* v, int64_t n, const AdamWScalars& s) {
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * s.grad_scale;
    const float mi = std::fma(gi, s.one_minus_beta1, m[i] * s.beta1);
    const float vi = std::fma(s.one_minus_beta2 * gi, gi, v[i] * s.beta2);
    const float denom = std::sqrt(vi) / s.bias2_sqrt + s.eps;
    p[i] = p[i] * s.decay + (s.neg_step * mi) / denom;
    m[i] = mi;
    v[i] = vi;
  }
}

struct SgdScalars {
  float grad_scale = 1;
  float weight_decay = 0;
  bool decays = false;
  float momentum = 0, one_minus_dampening = 1;
  float neg_lr = 0;
};

// libtorch 1.13's SGD: d = g.add(p, wd) (fmadd(p, wd, g)); with momentum, the buffer is d on the
// first step and buf.mul_(m).add_(d, 1 - dampening) after; p.add_(d or buf, -lr).
HT_FUSED_CLONES void sgd_pass(float* p, const float* g, float* buf, int64_t n, const SgdScalars& s, bool first) {
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * s.grad_scale;
    float d = s.decays ? std::fma(p[i], s.weight_decay, gi) : gi;
    if (buf != nullptr) {
      d = first ? d : std::fma(d, s.one_minus_dampening, buf[i] * s.momentum);
      buf[i] = d;
    }
    p[i] = std::fma(d, s.neg_lr, p[i]);
  }
}

// The pass takes dense, contiguous fp32 tensors on the CPU, its state laid out as the parameter.
// On meta tensors (a step traced without data, launcher/planning/meta_trace.h) as the traced
// device steps (`meta_fused`): the pass allocates nothing but the state, and has no values to compute.
bool fusable(const at::Tensor& p, const at::Tensor& grad, bool meta_fused) {
  return (p.device().is_cpu() || (p.is_meta() && meta_fused)) && p.scalar_type() == at::kFloat &&
         grad.scalar_type() == at::kFloat && !grad.is_sparse() && p.is_contiguous() && grad.is_contiguous();
}

// Refused before anything changes (the raw pass would read past a smaller gradient; torch::optim's
// kernels refuse a gradient that does not broadcast, and AdamW a sparse one, as libtorch's does).
void check_gradient(const char* optimizer, const at::Tensor& p, const at::Tensor& grad, bool sparse_allowed) {
  TORCH_CHECK(sparse_allowed || !grad.is_sparse(), optimizer, " does not support sparse gradients");
  TORCH_CHECK(grad.numel() == p.numel(), optimizer, ": a gradient of ", grad.sizes(), " for a parameter of ", p.sizes());
}

bool fusable_state(const at::Tensor& p, const at::Tensor& state) {
  return state.scalar_type() == at::kFloat && state.is_contiguous() && state.device() == p.device() &&
         state.numel() == p.numel();
}

// The scale applies to one step: whatever way the step ends, it is 1 after.
struct ResetScale {
  double& scale;
  ~ResetScale() { scale = 1.0; }
};

template <typename State, typename Optimizer>
State* state_of(Optimizer& optimizer, const at::Tensor& p) {
  auto& states = optimizer.state();
  using Key = typename std::decay_t<decltype(states)>::key_type;
  auto it = states.find(state_key<Key>(p));
  return it == states.end() ? nullptr : static_cast<State*>(it->second.get());
}

template <typename Optimizer>
void set_state(Optimizer& optimizer, const at::Tensor& p, std::unique_ptr<torch::optim::OptimizerParamState> state) {
  auto& states = optimizer.state();
  using Key = typename std::decay_t<decltype(states)>::key_type;
  states[state_key<Key>(p)] = std::move(state);
}

// The gradient as the unfused path reads it: scaled first, as clip_grad_norm scaled it.
at::Tensor scaled(const at::Tensor& grad, double scale) { return scale == 1.0 ? grad : grad * scale; }

}  // namespace

bool fused_step_is_vectorized() {
#if HT_FUSED_CLONED
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

at::Tensor FusedAdamW::step(LossClosure closure) {
  const ResetScale reset{scale_};
  at::NoGradGuard no_grad;
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups()) {
    auto& o = static_cast<torch::optim::AdamWOptions&>(group.options());
    const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const at::Tensor grad = p.grad();
      check_gradient("AdamW", p, grad, /*sparse_allowed=*/false);
      auto* state = state_of<torch::optim::AdamWParamState>(*this, p);
      if (state == nullptr) {
        auto made = std::make_unique<torch::optim::AdamWParamState>();
        made->step(0);
        made->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
        made->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        if (o.amsgrad()) made->max_exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        state = made.get();
        set_state(*this, p, std::move(made));
      }
      state->step(state->step() + 1);
      const double bias1 = 1 - std::pow(beta1, state->step()), bias2 = 1 - std::pow(beta2, state->step());
      at::Tensor& m = state->exp_avg();
      at::Tensor& v = state->exp_avg_sq();
      if (!fusable(p, grad, meta_fused_) || !fusable_state(p, m) || !fusable_state(p, v) || o.amsgrad()) {
        // libtorch's own sequence, on the scaled gradient.
        const at::Tensor g = scaled(grad, scale_);
        if (o.weight_decay() != 0) p.mul_(1 - o.lr() * o.weight_decay());
        m.mul_(beta1).add_(g, 1 - beta1);
        v.mul_(beta2).addcmul_(g, g, 1 - beta2);
        at::Tensor denom;
        if (o.amsgrad()) {
          at::Tensor& max_v = state->max_exp_avg_sq();
          at::maximum_out(max_v, max_v, v);
          denom = (max_v.sqrt() / std::sqrt(bias2)).add_(o.eps());
        } else {
          denom = (v.sqrt() / std::sqrt(bias2)).add_(o.eps());
        }
        p.addcdiv_(m, denom, -(o.lr() / bias1));
        continue;
      }
      if (p.is_meta()) continue;
      AdamWScalars s;
      s.grad_scale = static_cast<float>(scale_);
      s.decay = o.weight_decay() != 0 ? static_cast<float>(1 - o.lr() * o.weight_decay()) : 1.0f;
      s.beta1 = static_cast<float>(beta1);
      s.one_minus_beta1 = static_cast<float>(1 - beta1);
      s.beta2 = static_cast<float>(beta2);
      s.one_minus_beta2 = static_cast<float>(1 - beta2);
      s.bias2_sqrt = static_cast<float>(std::sqrt(bias2));
      s.eps = static_cast<float>(o.eps());
      s.neg_step = static_cast<float>(-(o.lr() / bias1));
      float* pp = p.data_ptr<float>();
      const float* gp = grad.data_ptr<float>();
      float* mp = m.data_ptr<float>();
      float* vp = v.data_ptr<float>();
      at::parallel_for(0, p.numel(), kGrain, [&](int64_t begin, int64_t end) {
        adamw_pass(pp + begin, gp + begin, mp + begin, vp + begin, end - begin, s);
      });
      p.unsafeGetTensorImpl()->bump_version();
    }
  }
  return loss;
}

at::Tensor FusedSgd::step(LossClosure closure) {
  const ResetScale reset{scale_};
  at::NoGradGuard no_grad;
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups()) {
    auto& o = static_cast<torch::optim::SGDOptions&>(group.options());
    TORCH_CHECK(!o.nesterov() || (o.momentum() > 0 && o.dampening() == 0),
                "Nesterov momentum requires a momentum and zero dampening");
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const at::Tensor grad = p.grad();
      check_gradient("SGD", p, grad, /*sparse_allowed=*/true);
      auto* state = o.momentum() != 0 ? state_of<torch::optim::SGDParamState>(*this, p) : nullptr;
      if (state != nullptr && !state->momentum_buffer().defined()) state = nullptr;  // made anew, as on a first step
      const bool first = o.momentum() != 0 && state == nullptr;
      const bool fused = fusable(p, grad, meta_fused_) && !o.nesterov() &&
                         (state == nullptr || fusable_state(p, state->momentum_buffer()));
      if (!fused) {
        at::Tensor d = scaled(grad, scale_);
        if (o.weight_decay() != 0) d = d.add(p, o.weight_decay());
        if (o.momentum() != 0) {
          at::Tensor buf;
          if (first) {
            buf = d.clone().detach();
            auto made = std::make_unique<torch::optim::SGDParamState>();
            made->momentum_buffer(buf);
            set_state(*this, p, std::move(made));
          } else {
            buf = state->momentum_buffer();
            buf.mul_(o.momentum()).add_(d, 1 - o.dampening());
          }
          d = o.nesterov() ? d.add(buf, o.momentum()) : buf;
        }
        p.add_(d, -o.lr());
        continue;
      }
      at::Tensor buf;
      if (o.momentum() != 0) {
        if (first) {
          buf = at::empty_like(p, at::MemoryFormat::Contiguous);
          auto made = std::make_unique<torch::optim::SGDParamState>();
          made->momentum_buffer(buf);
          set_state(*this, p, std::move(made));
        } else {
          buf = state->momentum_buffer();
        }
      }
      if (p.is_meta()) continue;
      SgdScalars s;
      s.grad_scale = static_cast<float>(scale_);
      s.decays = o.weight_decay() != 0;
      s.weight_decay = static_cast<float>(o.weight_decay());
      s.momentum = static_cast<float>(o.momentum());
      s.one_minus_dampening = static_cast<float>(1 - o.dampening());
      s.neg_lr = static_cast<float>(-o.lr());
      float* pp = p.data_ptr<float>();
      const float* gp = grad.data_ptr<float>();
      float* bp = buf.defined() ? buf.data_ptr<float>() : nullptr;
      at::parallel_for(0, p.numel(), kGrain, [&](int64_t begin, int64_t end) {
        sgd_pass(pp + begin, gp + begin, bp != nullptr ? bp + begin : nullptr, end - begin, s, first);
      });
      p.unsafeGetTensorImpl()->bump_version();
    }
  }
  return loss;
}

}  // namespace ht

// The fused passes (training/fused_optimizer.h). Compiled with -ffp-contract=off and
// -fno-math-errno (training/CMakeLists.txt): no multiply-add is fused unless written as std::fma,
// where libtorch's kernel fuses it, and sqrt vectorizes. Each pass is cloned for AVX-512, for
// AVX2 with FMA and for the baseline, and the loader picks the clone this CPU runs.
#include "training/fused_optimizer.h"

#include "training/fused_optimizer_cuda.h"
#include "training/optimizer_state_key.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <tuple>
#include <vector>

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
// One element: the moments given and returned in fp32.
__attribute__((always_inline)) inline void adamw_element(float& p, float g, float& m, float& v, const AdamWScalars& s) {
  const float gi = g * s.grad_scale;
  const float mi = std::fma(gi, s.one_minus_beta1, m * s.beta1);
  const float vi = std::fma(s.one_minus_beta2 * gi, gi, v * s.beta2);
  const float denom = std::sqrt(vi) / s.bias2_sqrt + s.eps;
  p = p * s.decay + (s.neg_step * mi) / denom;
  m = mi;
  v = vi;
}

// bf16 to fp32 (exact) and back, rounding to nearest even with NaN kept quiet: c10::BFloat16's
// conversion, which ATen's copy_ uses.
__attribute__((always_inline)) inline float widen_bf16(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
__attribute__((always_inline)) inline uint16_t round_bf16(float f) {
  if (std::isnan(f)) return 0x7FC0;
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return static_cast<uint16_t>((u + ((u >> 16) & 1) + 0x7FFF) >> 16);
}

// A gradient element as the passes read it: fp32 as it is, bf16 (training.gradient_dtype =
// "bf16") widened, exactly.
__attribute__((always_inline)) inline float gradient_value(float g) { return g; }
__attribute__((always_inline)) inline float gradient_value(uint16_t g) { return widen_bf16(g); }

template <typename G>
__attribute__((always_inline)) inline void adamw_loop(float* p, const G* g, float* m, float* v, int64_t n,
                                                      const AdamWScalars& s) {
  for (int64_t i = 0; i < n; ++i) adamw_element(p[i], gradient_value(g[i]), m[i], v[i], s);
}

// The moments in bf16: widened, stepped as the fp32 pass steps them, rounded back.
template <typename G>
__attribute__((always_inline)) inline void adamw_loop_bf16_moments(float* p, const G* g, uint16_t* m, uint16_t* v,
                                                                   int64_t n, const AdamWScalars& s) {
  for (int64_t i = 0; i < n; ++i) {
    float mi = widen_bf16(m[i]), vi = widen_bf16(v[i]);
    adamw_element(p[i], gradient_value(g[i]), mi, vi, s);
    m[i] = round_bf16(mi);
    v[i] = round_bf16(vi);
  }
}

// Each loop cloned for this CPU's vector units (a template cannot be cloned: one function each).
HT_FUSED_CLONES void adamw_pass(float* p, const float* g, float* m, float* v, int64_t n, const AdamWScalars& s) {
  adamw_loop(p, g, m, v, n, s);
}
HT_FUSED_CLONES void adamw_pass(float* p, const uint16_t* g, float* m, float* v, int64_t n, const AdamWScalars& s) {
  adamw_loop(p, g, m, v, n, s);
}
HT_FUSED_CLONES void adamw_pass_bf16_moments(float* p, const float* g, uint16_t* m, uint16_t* v, int64_t n,
                                              const AdamWScalars& s) {
  adamw_loop_bf16_moments(p, g, m, v, n, s);
}
HT_FUSED_CLONES void adamw_pass_bf16_moments(float* p, const uint16_t* g, uint16_t* m, uint16_t* v, int64_t n,
                                              const AdamWScalars& s) {
  adamw_loop_bf16_moments(p, g, m, v, n, s);
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
template <typename G>
__attribute__((always_inline)) inline void sgd_loop(float* p, const G* g, float* buf, int64_t n, const SgdScalars& s,
                                                    bool first) {
  for (int64_t i = 0; i < n; ++i) {
    const float gi = gradient_value(g[i]) * s.grad_scale;
    float d = s.decays ? std::fma(p[i], s.weight_decay, gi) : gi;
    if (buf != nullptr) {
      d = first ? d : std::fma(d, s.one_minus_dampening, buf[i] * s.momentum);
      buf[i] = d;
    }
    p[i] = std::fma(d, s.neg_lr, p[i]);
  }
}
HT_FUSED_CLONES void sgd_pass(float* p, const float* g, float* buf, int64_t n, const SgdScalars& s, bool first) {
  sgd_loop(p, g, buf, n, s, first);
}
HT_FUSED_CLONES void sgd_pass(float* p, const uint16_t* g, float* buf, int64_t n, const SgdScalars& s, bool first) {
  sgd_loop(p, g, buf, n, s, first);
}

// The pass takes dense, contiguous fp32 tensors on the CPU, its state laid out as the parameter.
// On meta tensors (a step traced without data, launcher/planning/meta_trace.h) as the traced
// device steps (`meta_fused`): the pass allocates nothing but the state, and has no values to compute.
// The gradient fp32, or bf16 (read widened).
bool fusable(const at::Tensor& p, const at::Tensor& grad, bool meta_fused) {
  return (p.device().is_cpu() || (p.is_meta() && meta_fused)) && p.scalar_type() == at::kFloat &&
         (grad.scalar_type() == at::kFloat || grad.scalar_type() == at::kBFloat16) && !grad.is_sparse() &&
         p.is_contiguous() && grad.is_contiguous();
}

// The pass's pointer to `grad`'s elements: fp32's, or bf16's bits.
template <typename F>
void with_gradient_elements(const at::Tensor& grad, F&& f) {
  if (grad.scalar_type() == at::kBFloat16) {
    f(reinterpret_cast<const uint16_t*>(grad.data_ptr<at::BFloat16>()));
  } else {
    f(grad.data_ptr<float>());
  }
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

// AdamW's two moments: both fp32 or both bf16 (the two passes), each laid out as the parameter.
bool fusable_moments(const at::Tensor& p, const at::Tensor& m, const at::Tensor& v) {
  auto laid_out = [&](const at::Tensor& t) {
    return t.is_contiguous() && t.device() == p.device() && t.numel() == p.numel();
  };
  return (m.scalar_type() == at::kFloat || m.scalar_type() == at::kBFloat16) && v.scalar_type() == m.scalar_type() &&
         laid_out(m) && laid_out(v);
}

// The scale applies to one step: whatever way the step ends, it is 1 after.
struct ResetScale {
  GradientScale& scale;
  ~ResetScale() { scale = GradientScale{}; }
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

// The gradient as the unfused path reads it: in the parameter's type (a 16-bit gradient of an
// fp32 weight widened, exactly, before anything else rounds it), scaled, as clip_grad_norm scaled it.
at::Tensor scaled(const at::Tensor& grad, const at::Tensor& p, const GradientScale& scale) {
  const at::Tensor g = grad.scalar_type() != p.scalar_type() && !grad.is_sparse() ? grad.to(p.scalar_type()) : grad;
  return scale.is_one() ? g : scale.applied_to(g);
}

// One parameter's AdamW step: the options, the gradient's scale, the betas and the bias corrections.
struct AdamWStep {
  const torch::optim::AdamWOptions& o;
  const GradientScale& scale;
  double beta1, beta2, bias1, bias2;
};

// torch::optim's AdamW kernels on the moments m and v (fp32).
void adamw_sequence(at::Tensor& p, const at::Tensor& g, at::Tensor& m, at::Tensor& v,
                    torch::optim::AdamWParamState& state, const AdamWStep& a) {
  if (a.o.weight_decay() != 0) p.mul_(1 - a.o.lr() * a.o.weight_decay());
  m.mul_(a.beta1).add_(g, 1 - a.beta1);
  v.mul_(a.beta2).addcmul_(g, g, 1 - a.beta2);
  at::Tensor denom;
  if (a.o.amsgrad()) {
    at::Tensor& max_v = state.max_exp_avg_sq();
    at::maximum_out(max_v, max_v, v);
    denom = (max_v.sqrt() / std::sqrt(a.bias2)).add_(a.o.eps());
  } else {
    denom = (v.sqrt() / std::sqrt(a.bias2)).add_(a.o.eps());
  }
  p.addcdiv_(m, denom, -(a.o.lr() / a.bias1));
}

// libtorch's own sequence, on the scaled gradient; moments not in fp32 widened first and rounded
// back after (what the bf16 pass does element by element).
void adamw_unfused(at::Tensor& p, const at::Tensor& grad, torch::optim::AdamWParamState& state, const AdamWStep& a) {
  const at::Tensor g = scaled(grad, p, a.scale);
  const bool narrow = state.exp_avg().scalar_type() != p.scalar_type();
  at::Tensor m = narrow ? state.exp_avg().to(p.scalar_type()) : state.exp_avg();
  at::Tensor v = narrow ? state.exp_avg_sq().to(p.scalar_type()) : state.exp_avg_sq();
  adamw_sequence(p, g, m, v, state, a);
  if (narrow) {
    state.exp_avg().copy_(m);
    state.exp_avg_sq().copy_(v);
  }
}

void adamw_fused(at::Tensor& p, const at::Tensor& grad, torch::optim::AdamWParamState& state, const AdamWStep& a) {
  AdamWScalars s;
  s.grad_scale = static_cast<float>(a.scale.read());
  s.decay = a.o.weight_decay() != 0 ? static_cast<float>(1 - a.o.lr() * a.o.weight_decay()) : 1.0f;
  s.beta1 = static_cast<float>(a.beta1);
  s.one_minus_beta1 = static_cast<float>(1 - a.beta1);
  s.beta2 = static_cast<float>(a.beta2);
  s.one_minus_beta2 = static_cast<float>(1 - a.beta2);
  s.bias2_sqrt = static_cast<float>(std::sqrt(a.bias2));
  s.eps = static_cast<float>(a.o.eps());
  s.neg_step = static_cast<float>(-(a.o.lr() / a.bias1));
  float* pp = p.data_ptr<float>();
  with_gradient_elements(grad, [&](const auto* gp) {
    if (state.exp_avg().scalar_type() == at::kBFloat16) {
      auto* mp = reinterpret_cast<uint16_t*>(state.exp_avg().data_ptr<at::BFloat16>());
      auto* vp = reinterpret_cast<uint16_t*>(state.exp_avg_sq().data_ptr<at::BFloat16>());
      at::parallel_for(0, p.numel(), kGrain, [&](int64_t begin, int64_t end) {
        adamw_pass_bf16_moments(pp + begin, gp + begin, mp + begin, vp + begin, end - begin, s);
      });
    } else {
      float* mp = state.exp_avg().data_ptr<float>();
      float* vp = state.exp_avg_sq().data_ptr<float>();
      at::parallel_for(0, p.numel(), kGrain, [&](int64_t begin, int64_t end) {
        adamw_pass(pp + begin, gp + begin, mp + begin, vp + begin, end - begin, s);
      });
    }
  });
  p.unsafeGetTensorImpl()->bump_version();
}

// libtorch's own sequence, on the scaled gradient; returns the momentum buffer a first step makes.
at::Tensor sgd_unfused(at::Tensor& p, const at::Tensor& grad, at::Tensor buf, bool first,
                       const torch::optim::SGDOptions& o, const GradientScale& scale) {
  at::Tensor d = scaled(grad, p, scale);
  if (o.weight_decay() != 0) d = d.add(p, o.weight_decay());
  at::Tensor made;
  if (o.momentum() != 0) {
    if (first) {
      buf = made = d.clone().detach();
    } else {
      buf.mul_(o.momentum()).add_(d, 1 - o.dampening());
    }
    d = o.nesterov() ? d.add(buf, o.momentum()) : buf;
  }
  p.add_(d, -o.lr());
  return made;
}

// `buf`: the momentum buffer (undefined without momentum), made empty on a first step.
void sgd_fused(at::Tensor& p, const at::Tensor& grad, const at::Tensor& buf, bool first,
               const torch::optim::SGDOptions& o, const GradientScale& scale) {
  SgdScalars s;
  s.grad_scale = static_cast<float>(scale.read());
  s.decays = o.weight_decay() != 0;
  s.weight_decay = static_cast<float>(o.weight_decay());
  s.momentum = static_cast<float>(o.momentum());
  s.one_minus_dampening = static_cast<float>(1 - o.dampening());
  s.neg_lr = static_cast<float>(-o.lr());
  float* pp = p.data_ptr<float>();
  float* bp = buf.defined() ? buf.data_ptr<float>() : nullptr;
  with_gradient_elements(grad, [&](const auto* gp) {
    at::parallel_for(0, p.numel(), kGrain, [&](int64_t begin, int64_t end) {
      sgd_pass(pp + begin, gp + begin, bp != nullptr ? bp + begin : nullptr, end - begin, s, first);
    });
  });
  p.unsafeGetTensorImpl()->bump_version();
}

// The closure's loss with gradients on, as torch::optim's steps evaluate it first; undefined without one.
at::Tensor loss_of(const torch::optim::Optimizer::LossClosure& closure) {
  if (!closure) return {};
  at::AutoGradMode enable_grad(true);
  return closure();
}

}  // namespace

double GradientScale::read() const {
  return on_device.defined() ? on_device.item<double>() : value;
}

at::Tensor GradientScale::applied_to(at::Tensor g) const {
  if (!on_device.defined() || on_device.device() != g.device()) return g * read();
  // As ATen multiplies by a number: in g's type's arithmetic type (fp32 for 16-bit types), the
  // coefficient rounded to it, the product rounded to g's type: the same bits as `g * read()`.
  // (A 0-dim tensor of g's own type would round the coefficient to 16 bits first.)
  const bool narrow = g.scalar_type() == at::kBFloat16 || g.scalar_type() == at::kHalf;
  if (!narrow) return g.mul_(on_device.to(g.scalar_type()));
  return g.copy_(g.to(at::kFloat).mul_(on_device.to(at::kFloat)));
}

void FusedStep::set_gradient_scale(const at::Tensor& coefficient) {
  if (!coefficient.defined()) {
    scale_ = GradientScale{};
  } else if (coefficient.is_cuda()) {
    scale_ = GradientScale{1.0, coefficient};
  } else {
    scale_ = GradientScale{coefficient.item<double>(), {}};  // the host's: reading it waits for nothing
  }
}

bool fused_step_is_vectorized() {
#if HT_FUSED_CLONED
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

at::Tensor FusedAdamW::step(LossClosure closure) {
  const ResetScale reset{scale_};
  const at::Tensor loss = loss_of(closure);
  at::NoGradGuard no_grad;
  for (auto& group : param_groups()) {
    auto& o = static_cast<torch::optim::AdamWOptions&>(group.options());
    const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
    // The group's CUDA parameters by step count, type and device: ATen's kernel takes one of each.
    std::map<std::tuple<int64_t, at::ScalarType, c10::DeviceIndex>, AdamWCudaBatch> cuda;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const at::Tensor grad = p.grad();
      check_gradient("AdamW", p, grad, /*sparse_allowed=*/false);
      auto* state = state_of<torch::optim::AdamWParamState>(*this, p);
      // The moments in the configured type (a float parameter's; others keep theirs).
      const at::ScalarType moments = p.scalar_type() == at::kFloat ? state_dtype_ : p.scalar_type();
      if (state == nullptr) {
        auto made = std::make_unique<torch::optim::AdamWParamState>();
        made->step(0);
        made->exp_avg(at::zeros_like(p, p.options().dtype(moments), at::MemoryFormat::Preserve));
        made->exp_avg_sq(at::zeros_like(p, p.options().dtype(moments), at::MemoryFormat::Preserve));
        if (o.amsgrad()) made->max_exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        state = made.get();
        set_state(*this, p, std::move(made));
      } else if (state->exp_avg().scalar_type() != moments) {
        // Read from a checkpoint written in the other type.
        state->exp_avg(state->exp_avg().to(moments));
        state->exp_avg_sq(state->exp_avg_sq().to(moments));
      }
      state->step(state->step() + 1);
      if (!o.amsgrad() && adamw_cuda_fusable(p, grad, state->exp_avg(), state->exp_avg_sq())) {
        cuda[{state->step(), p.scalar_type(), p.device().index()}].add(p, grad, *state);
        continue;
      }
      const AdamWStep a{o, scale_, beta1, beta2, 1 - std::pow(beta1, state->step()), 1 - std::pow(beta2, state->step())};
      if (!fusable(p, grad, meta_fused_) || !fusable_moments(p, state->exp_avg(), state->exp_avg_sq()) ||
          o.amsgrad()) {
        adamw_unfused(p, grad, *state, a);
      } else if (!p.is_meta()) {
        adamw_fused(p, grad, *state, a);
      }
    }
    for (auto& [key, b] : cuda) b.launch(std::get<0>(key), o, scale_);
  }
  return loss;
}

at::Tensor FusedSgd::step(LossClosure closure) {
  const ResetScale reset{scale_};
  const at::Tensor loss = loss_of(closure);
  at::NoGradGuard no_grad;
  for (auto& group : param_groups()) {
    auto& o = static_cast<torch::optim::SGDOptions&>(group.options());
    TORCH_CHECK(!o.nesterov() || (o.momentum() > 0 && o.dampening() == 0),
                "Nesterov momentum requires a momentum and zero dampening");
    // The group's CUDA parameters by first step, type and device: ATen's kernel takes one of each.
    std::map<std::tuple<bool, at::ScalarType, c10::DeviceIndex>, SgdCudaBatch> cuda;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const at::Tensor grad = p.grad();
      check_gradient("SGD", p, grad, /*sparse_allowed=*/true);
      auto* state = o.momentum() != 0 ? state_of<torch::optim::SGDParamState>(*this, p) : nullptr;
      if (state != nullptr && !state->momentum_buffer().defined()) state = nullptr;  // made anew, as on a first step
      const bool first = o.momentum() != 0 && state == nullptr;
      const bool fused = fusable(p, grad, meta_fused_) && !o.nesterov() &&
                         (state == nullptr || fusable_state(p, state->momentum_buffer()));
      at::Tensor buf = state != nullptr ? state->momentum_buffer() : at::Tensor();
      const auto keep = [&](const at::Tensor& made) {
        auto kept = std::make_unique<torch::optim::SGDParamState>();
        kept->momentum_buffer(made);
        set_state(*this, p, std::move(kept));
      };
      if (sgd_cuda_fusable(p, grad, buf)) {
        if (first) {
          buf = at::empty_like(p, at::MemoryFormat::Contiguous);
          keep(buf);
        }
        cuda[{first, p.scalar_type(), p.device().index()}].add(p, grad, buf);
        continue;
      }
      if (!fused) {
        const at::Tensor made = sgd_unfused(p, grad, buf, first, o, scale_);
        if (made.defined()) keep(made);
        continue;
      }
      if (first) {
        buf = at::empty_like(p, at::MemoryFormat::Contiguous);
        keep(buf);
      }
      if (!p.is_meta()) sgd_fused(p, grad, buf, first, o, scale_);
    }
    for (auto& [key, b] : cuda) b.launch(o, std::get<0>(key), scale_);
  }
  return loss;
}

}  // namespace ht

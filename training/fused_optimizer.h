#pragma once
// AdamW and SGD with momentum as one pass over each parameter: each element's gradient, state and
// weight are read once and written once (libtorch's step runs five to seven kernels per parameter,
// each a pass over memory: 108 bytes moved per fp32 parameter for AdamW against the fused pass's
// 32). They are torch::optim's own classes with step() replaced, so their options, state,
// save/load and every helper of training/optimizer.h are unchanged.
//
// The arithmetic is libtorch 1.13's kernels', element for element, in the same order with the
// same roundings: where a kernel multiplies and adds in one fused multiply-add (ATen's add with
// alpha, and its addcmul as GCC contracts it on a CPU with FMA) so does this pass, and nowhere
// else. fp32 training is then bit for bit what torch::optim gives (tests/training/test_fused_optimizer.cpp).
//
// The clipping coefficient (max_norm / norm) is applied inside the pass, to each gradient as it is
// read: the same bits as multiplying the gradients first, without the pass that did it.
//
// On CUDA (libtorch >= 2.4), the parameters go to ATen's multi-tensor kernels instead
// (training/fused_optimizer_cuda.h), the ones torch.optim's AdamW(fused=True) and
// SGD(fused=True) run: one launch for many tensors, the clipping coefficient applied as it reads
// each gradient (and, unlike the CPU pass, the scaled gradient written back). Their arithmetic is
// not torch::optim's sequence (AdamW's has fewer roundings, SGD's is in double): within rounding
// of it, the same bits run to run (tests/training/test_fused_optimizer.cpp).
//
// A gradient in bf16 (training.gradient_dtype = "bf16") is read widened, exactly, by the CPU
// pass: the same bits as widening it first. ATen's CUDA kernels want it in the parameter's type:
// on CUDA AdamW's batch widens such gradients about 64 MiB at a time for its launches (not yet
// run on a GPU); SGD's steps them as torch::optim does.
//
// A parameter neither takes (not fp32, not dense and contiguous, on CUDA moments in another type
// than the parameter's, AdamW with amsgrad, SGD's bf16 gradients on CUDA) steps as torch::optim
// steps it, its gradient widened to the parameter's type and scaled first.

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

namespace ht {

// The clipping coefficient of one step: a number, or a GPU's 0-dim tensor the host does not read
// (a step that reads no device value queues its update without waiting for the device).
struct GradientScale {
  double value = 1.0;    // where `on_device` is undefined
  at::Tensor on_device;  // defined: the coefficient, on a GPU
  bool is_one() const { return !on_device.defined() && value == 1.0; }
  // The coefficient as a number: reads `on_device` (waiting for the device) where a parameter
  // stepped by a host pass needs it.
  double read() const;
  // `g` multiplied by it, in g's type, as ATen multiplies by a number: out of place by the host's
  // number; in place by the device's (no gradient-sized temporary, which the planner's trace of a
  // step with a scale of 1 would not count: the gradient goes after the step, and ATen's fused
  // kernels write the scaled one back too).
  at::Tensor applied_to(at::Tensor g) const;
};

// What training/optimizer.cpp sets on a fused optimizer before its step.
class FusedStep {
 public:
  virtual ~FusedStep() = default;
  // Every gradient of the next step is multiplied by `scale` (in fp32) as the step reads it; the
  // step then sets it back to 1.
  void set_gradient_scale(double scale) { scale_ = GradientScale{scale, {}}; }
  // The same with the coefficient a 0-dim double tensor (undefined: 1): one on the CPU is read,
  // one on a GPU stays there, and ATen's CUDA kernels read it.
  void set_gradient_scale(const at::Tensor& coefficient);
  // A step traced on meta tensors (launcher/planning/meta_trace.h) takes the path the traced
  // device takes: the fused pass (true: this CPU) or torch::optim's kernels with their
  // temporaries (false: a GPU, where the pass does not run).
  void set_meta_as_fused(bool fused) { meta_fused_ = fused; }

 protected:
  GradientScale scale_;
  bool meta_fused_ = true;
};

class FusedAdamW final : public torch::optim::AdamW, public FusedStep {
 public:
  using torch::optim::AdamW::AdamW;
  at::Tensor step(LossClosure closure = nullptr) override;
  // The type of the two moments (fp32 or bf16): made in it; a state read in the other type (a
  // checkpoint's) is converted as it is set (set_optimizer_state, keep_moments_in_their_dtype),
  // and failing that at its next step. In bf16 each step widens them, updates in fp32
  // exactly as the fp32 step does, and rounds them back to nearest even, as ATen's copy rounds.
  void set_state_dtype(at::ScalarType dtype) { state_dtype_ = dtype; }
  at::ScalarType state_dtype() const { return state_dtype_; }

 private:
  at::ScalarType state_dtype_ = at::kFloat;
};

class FusedSgd final : public torch::optim::SGD, public FusedStep {
 public:
  using torch::optim::SGD::SGD;
  at::Tensor step(LossClosure closure = nullptr) override;
};

// True where this CPU runs the pass with fused multiply-adds in hardware (AVX2 with FMA, or
// AVX-512, built with GCC 12 or later): elsewhere it is correct but slow (each fused multiply-add
// a library call), and where ATen's own kernels run without FMA (a CPU without AVX2) its results
// differ from torch::optim's by rounding.
bool fused_step_is_vectorized();

}  // namespace ht

// Softmax, log-softmax and the negative log-likelihood loss.
#include "runtime/ops/op_util.h"

#include <ATen/core/Reduction.h>

#include <algorithm>

namespace ht {
namespace {

using TensorList = std::vector<at::Tensor>;

// Rows whose target is this are left out of the loss (ATen's default ignore_index).
constexpr int64_t kIgnoreIndex = -100;

// Rows per chunk of (rows, classes) scores: a `pieces`-th of the rows, and at least `min_bytes` of
// fp32 scores (small class counts run whole). Shapes only, so a meta trace chunks as a data run does.
int64_t rows_per_chunk(int64_t rows, int64_t classes, int64_t pieces, int64_t min_bytes) {
  const int64_t row_bytes = std::max<int64_t>(1, classes) * 4;
  return std::max<int64_t>(1, std::max((rows + pieces - 1) / pieces, (min_bytes + row_bytes - 1) / row_bytes));
}

// nll_loss and cross_entropy take (N, K) scores and (N) int64 targets.
void check_loss_arguments(const char* op, const Tensor& scores, const Tensor& target) {
  TORCH_CHECK(scores.dim() == 2 && target.dim() == 1 && target.size(0) == scores.size(0), op, ": (N, K) and (N) ",
              "expected, got ", scores.sizes(), " and ", target.sizes());
  TORCH_CHECK(target.dtype() == at::kLong, op, ": target must be int64, got ", target.dtype());
}

class SoftmaxOp final : public Op {
 public:
  SoftmaxOp(int64_t dim, bool log)
      : Op(OpTraits::named(log ? "log_softmax" : "softmax").saving_outputs({0}).in_float32()), dim_(dim),
        log_(log) {}

  TensorList forward(const TensorList& in, const ForwardContext&) const override {
    return {log_ ? at::_log_softmax(in[0], dim_, false) : at::_softmax(in[0], dim_, false)};
  }
  TensorList backward(const BackwardArgs& a) const override {
    const at::ScalarType dtype = a.input_dtype(0);
    return {log_ ? at::_log_softmax_backward_data(a.grad_outputs[0], a.outputs[0], dim_, dtype)
                 : at::_softmax_backward_data(a.grad_outputs[0], a.outputs[0], dim_, dtype)};
  }

 private:
  int64_t dim_;
  bool log_;
};

// Outputs (loss, total_weight); mean reduction, no class weights.
class NllLossOp final : public Op {
 public:
  NllLossOp() : Op(OpTraits::named("nll_loss").saving_inputs({0, 1}).saving_outputs({1}).in_float32()) {}

  TensorList forward(const TensorList& in, const ForwardContext&) const override {
    auto [loss, total_weight] =
        at::nll_loss_forward(in[0], in[1], {}, at::Reduction::Mean, kIgnoreIndex);
    return {loss, total_weight};
  }
  TensorList backward(const BackwardArgs& a) const override {
    return {at::nll_loss_backward(a.grad_outputs[0], a.inputs[0], a.inputs[1], {},
                                  at::Reduction::Mean, kIgnoreIndex, a.outputs[1]),
            at::Tensor()};
  }
};

// log_softmax and nll_loss in one op that never holds the (N, K) log-probabilities whole: with
// a large vocabulary (Llama's 128k, GPT-2's 50k) they and their gradient were the largest blocks
// of a decoder's step, and the loss's backward held three of that size at once (the saved
// log-probabilities, their gradient, the logits' gradient): the floor under any budget. Here
// forward keeps only each row's target log-probability, and backward regenerates the
// log-probabilities a chunk of rows at a time, writing the logits' gradient chunk by chunk.
// Every kernel is the one the two-op form runs, on rows that do not depend on each other (a
// row's softmax reads only its row; nll_loss sums the same per-row values in the same order from
// an (N, 1) matrix as from (N, K)), so the loss and every gradient are the same bits as
// nll_loss(log_softmax(logits)) (tests/runtime/test_ops_loss.cpp), in any chunking.
// Outputs (loss, total_weight); mean reduction, or the sum over the rows (the mean's numerator:
// linear_cross_entropy's chunks), no class weights.
class CrossEntropyOp final : public Op {
 public:
  // Its work: forward reads the logits twice and writes the log-probabilities once, a chunk at a
  // time (three times fp32 logits' bytes, the two-op form's log_softmax and nll_loss together).
  // 16-bit logits are cast to fp32 a chunk at a time inside it: 2 bytes read and 4 written in a
  // type-converting loop, which ran at 0.37 of a copy's bandwidth on an H200 (as 16 bytes of a
  // copy), then fp32's 12: as 28 bytes, fourteen times their own. Backward, priced at twice
  // forward (planner/step_recorder.cpp), does it again and the gradient.
  CrossEntropyOp(bool sixteen_bit, bool sum)
      : Op(OpTraits::named("cross_entropy").saving_inputs({0, 1}).saving_outputs({1}).keeping_input_types()
               .moving_its_bytes(sixteen_bit ? 14 : 3)),
        reduction_(sum ? at::Reduction::Sum : at::Reduction::Mean) {}

  TensorList forward(const TensorList& in, const ForwardContext&) const override {
    const at::Tensor& logits = in[0];
    const at::Tensor& target = in[1];
    const int64_t n = logits.size(0), rows = chunk_rows(logits);
    at::Tensor picked = at::empty({n, 1}, logits.options().dtype(compute_type(logits)));
    for (int64_t r = 0; r < n; r += rows) {
      const int64_t m = std::min(rows, n - r);
      const at::Tensor t = target.narrow(0, r, m);
      const at::Tensor lp = at::_log_softmax(chunk(logits, r, m), 1, false);
      // An ignored row's index is out of range: any valid one will do, nll_loss skips the row.
      picked.narrow(0, r, m).copy_(lp.gather(1, t.masked_fill(t.eq(kIgnoreIndex), 0).unsqueeze(1)));
    }
    // The target of every row is now column 0, but where the row is ignored.
    const at::Tensor column = at::zeros_like(target).masked_fill_(target.eq(kIgnoreIndex), kIgnoreIndex);
    auto [loss, total_weight] = at::nll_loss_forward(picked, column, {}, reduction_, kIgnoreIndex);
    return {loss, total_weight};
  }
  // The logits' gradient in their own type: each chunk's fp32 gradient rounded as the cast op's
  // backward rounded the whole (the same kernel, elementwise).
  TensorList backward(const BackwardArgs& a) const override {
    const at::Tensor& logits = a.inputs[0];
    const at::Tensor& target = a.inputs[1];
    const at::ScalarType compute = compute_type(logits);
    const int64_t n = logits.size(0), rows = chunk_rows(logits);
    at::Tensor grad = at::empty_like(logits, at::MemoryFormat::Contiguous);
    for (int64_t r = 0; r < n; r += rows) {
      const int64_t m = std::min(rows, n - r);
      const at::Tensor lp = at::_log_softmax(chunk(logits, r, m), 1, false);
      const at::Tensor g = at::nll_loss_backward(a.grad_outputs[0], lp, target.narrow(0, r, m), {}, reduction_,
                                                 kIgnoreIndex, a.outputs[1]);
      at::Tensor out = grad.narrow(0, r, m);
      if (compute == logits.scalar_type()) {
        at::_log_softmax_backward_data_out(out, g, lp, 1, compute);
      } else {
        out.copy_(at::_log_softmax_backward_data(g, lp, 1, compute));
      }
    }
    return {grad, at::Tensor()};
  }

 private:
  // fp32 for 16-bit and fp32 logits, double for double: what autocast's cast to fp32 gave.
  static at::ScalarType compute_type(const at::Tensor& logits) {
    return logits.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  }
  static at::Tensor chunk(const at::Tensor& logits, int64_t r, int64_t m) {
    const at::Tensor rows = logits.narrow(0, r, m);
    return rows.scalar_type() == compute_type(logits) ? rows : rows.to(compute_type(logits));
  }
  // Rows per chunk: a sixteenth of the batch, and at least 1 MiB of fp32 log-probabilities.
  static int64_t chunk_rows(const at::Tensor& logits) {
    return rows_per_chunk(logits.size(0), logits.size(1), 16, int64_t{1} << 20);
  }
  int64_t reduction_;
};

std::shared_ptr<const Op> cross_entropy_op(const Tensor& logits, bool sum) {
  static const std::shared_ptr<const Op> ops[2][2] = {
      {std::make_shared<CrossEntropyOp>(false, false), std::make_shared<CrossEntropyOp>(false, true)},
      {std::make_shared<CrossEntropyOp>(true, false), std::make_shared<CrossEntropyOp>(true, true)}};
  const bool narrow = logits.dtype() == at::kBFloat16 || logits.dtype() == at::kHalf;
  return ops[narrow ? 1 : 0][sum ? 1 : 0];
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) {
  return detail::apply_first(std::make_shared<SoftmaxOp>(detail::normalize_dim(dim, x.dim()), false),
                             {x});
}

Tensor log_softmax(const Tensor& x, int64_t dim) {
  return detail::apply_first(std::make_shared<SoftmaxOp>(detail::normalize_dim(dim, x.dim()), true),
                             {x});
}

Tensor nll_loss(const Tensor& log_probs, const Tensor& target) {
  check_loss_arguments("nll_loss", log_probs, target);
  static const std::shared_ptr<const Op> op = std::make_shared<NllLossOp>();
  return detail::apply_first(op, {log_probs, target});
}

// Logits of any floating type go in as they are (no fp32 copy of them, nor of their gradient:
// at GPT-2's vocabulary and 128 sequences, 26 GB each); the op computes in fp32 a chunk at a time.
Tensor cross_entropy(const Tensor& logits, const Tensor& target) {
  check_loss_arguments("cross_entropy", logits, target);
  return detail::apply_first(cross_entropy_op(logits, false), {logits, target});
}

int64_t linear_cross_entropy_rows(int64_t rows, int64_t classes) {
  return rows_per_chunk(rows, classes, 8, int64_t{2} << 20);
}

// Each chunk's logits are their own tensor, made by their own linear and read by their own loss:
// a budget evicts and regenerates one chunk (x's rows times the weight), and backward holds one
// chunk's gradient at a time (the weight's gradient accumulates chunk by chunk). Nothing here
// depends on memory, so a budgeted run and its unbudgeted twin run the same kernels.
Tensor linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor& target) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), "linear_cross_entropy: (N, D) and ",
              "(V, D) expected, got ", x.sizes(), " and ", weight.sizes());
  check_loss_arguments("linear_cross_entropy", x, target);
  const int64_t n = x.size(0), rows = linear_cross_entropy_rows(n, weight.size(0));
  if (rows >= n) return cross_entropy(linear(x, weight), target);
  std::vector<int64_t> sizes;
  for (int64_t r = 0; r < n; r += rows) sizes.push_back(std::min(rows, n - r));
  const std::vector<Tensor> xs = split(x, sizes, 0), ts = split(target, sizes, 0);
  Tensor total, weights;
  for (size_t c = 0; c < xs.size(); ++c) {
    const Tensor logits = linear(xs[c], weight);
    const std::vector<Tensor> out = x.interp().apply(cross_entropy_op(logits, true), {logits, ts[c]});
    total = c == 0 ? out[0] : add(total, out[0]);
    weights = c == 0 ? out[1] : add(weights, out[1]);
  }
  return div(total, weights);
}

}  // namespace ht

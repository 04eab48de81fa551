// Tensor parallelism's ops (runtime/tensor_parallel.h): Megatron's f and g, sequence
// parallelism's reduce-scatter and all-gathering linear, and the vocabulary-parallel embedding and
// cross entropy. An op whose forward exchanges with the group is declared a collective
// (OpTraits::collective): DTR, whose choices are the same on every rank of the group, may evict
// its output and re-run the exchange on every rank at the same point; a static plan keeps it.
// Exchanges of a recomputation are counted apart ("... (recomputation)").
#include "runtime/ops/op_util.h"

#include <cmath>
#include <limits>

namespace ht {
namespace {

using detail::bit_if;
using TensorList = std::vector<at::Tensor>;

TensorParallelGroup& group_of(const Tensor& x, const char* op) {
  TensorParallelGroup* group = x.interp().tensor_parallel();
  TORCH_CHECK(group != nullptr, op, ": no tensor-parallel group is set on the interpreter (Interpreter::set_tensor_parallel)");
  TORCH_CHECK(x.interp().mode() == ExecutionMode::kInterpreted, op,
              ": tensor-parallel ops run in interpreted mode only (their backward is a collective)");
  return *group;
}

// Every rank's `piece` concatenated along `dim`, rank 0's first.
at::Tensor gather_along(TensorParallelGroup& group, const at::Tensor& piece, int64_t dim, const char* what) {
  const at::Tensor dense = piece.contiguous();
  at::Tensor buffer = at::empty({group.size() * dense.numel()}, dense.options());
  group.all_gather(dense.view(-1), buffer, what);
  std::vector<int64_t> stacked = dense.sizes().vec(), whole = dense.sizes().vec();
  stacked.insert(stacked.begin(), group.size());
  whole[dim] *= group.size();
  return buffer.view(stacked).movedim(0, dim).reshape(whole);  // a copy unless dim is 0
}

// The group's sum of `whole`, this rank's piece of it along `dim`.
at::Tensor scatter_along(TensorParallelGroup& group, const at::Tensor& whole, int64_t dim, const char* what) {
  const int64_t t = group.size();
  TORCH_CHECK(whole.size(dim) % t == 0, "tensor parallelism: dimension ", dim, " of ", whole.sizes(),
              " does not divide among ", t, " ranks");
  std::vector<int64_t> split = whole.sizes().vec(), piece = whole.sizes().vec();
  split[dim] /= t;
  split.insert(split.begin() + dim, t);
  piece[dim] /= t;
  const at::Tensor stacked = whole.reshape(split).movedim(dim, 0).contiguous();
  at::Tensor shard = at::empty(piece, whole.options());
  group.reduce_scatter_sum(stacked.view(-1), shard, what);
  return shard;
}

at::Tensor summed(TensorParallelGroup& group, const at::Tensor& x, const char* what) {
  at::Tensor out = x.clone(at::MemoryFormat::Contiguous);
  group.allreduce_sum(out, what);
  return out;
}

// Megatron's f: the identity forward, the group's sum of the gradients backward (where a
// replicated activation enters a split region). A view of its input.
class CopyToGroupOp final : public Op {
 public:
  explicit CopyToGroupOp(TensorParallelGroup& group) : Op(OpTraits::named("tp_copy")), group_(group) {}
  TensorList forward(const TensorList& in, const ForwardContext&) const override { return {in[0].view_as(in[0])}; }
  TensorList backward(const BackwardArgs& a) const override {
    return {summed(group_, a.grad_outputs[0], "f's all-reduce (backward)")};
  }

 private:
  TensorParallelGroup& group_;
};

OpTraits exchanging(const char* name) { return OpTraits::named(name).exchanging_with_its_group(); }

// What a forward's exchange is for, or that it repeats one for a recomputation.
const char* forward_use(const ForwardContext& ctx, const char* use) { return ctx.recompute ? "recomputation" : use; }

// Megatron's g: the group's sum forward (where a split region's partial results leave it), the
// identity backward.
class ReduceFromGroupOp final : public Op {
 public:
  explicit ReduceFromGroupOp(TensorParallelGroup& group) : Op(exchanging("tp_reduce")), group_(group) {}
  TensorList forward(const TensorList& in, const ForwardContext& ctx) const override {
    return {summed(group_, in[0], forward_use(ctx, "g's all-reduce (forward)"))};
  }
  TensorList backward(const BackwardArgs& a) const override { return {a.grad_outputs[0]}; }

 private:
  TensorParallelGroup& group_;
};

// Sequence parallelism's g: the sum's piece along `dim` forward, the all-gather backward.
class ReduceScatterOp final : public Op {
 public:
  ReduceScatterOp(TensorParallelGroup& group, int64_t dim)
      : Op(exchanging("tp_reduce_scatter")), group_(group), dim_(dim) {}
  TensorList forward(const TensorList& in, const ForwardContext& ctx) const override {
    return {scatter_along(group_, in[0], dim_, forward_use(ctx, "sequence parallelism's reduce-scatter (forward)"))};
  }
  TensorList backward(const BackwardArgs& a) const override {
    return {gather_along(group_, a.grad_outputs[0], dim_, "sequence parallelism's all-gather (backward)")};
  }

 private:
  TensorParallelGroup& group_;
  int64_t dim_;
};

// Sequence parallelism's f fused with the column-parallel linear that follows it: the input's
// pieces gathered along `dim`, then x W^T + b. It saves the piece, never the gathered input, and
// gathers again in backward (Korthikanti et al.: the activations tensor parallelism would
// replicate are stored once across the group); the input's gradient is reduce-scattered.
class GatherLinearOp final : public Op {
 public:
  GatherLinearOp(TensorParallelGroup& group, int64_t dim, bool has_bias, bool x_grad, bool w_grad)
      : Op(traits_for(x_grad, w_grad)), group_(group), dim_(dim), has_bias_(has_bias) {}

  TensorList forward(const TensorList& in, const ForwardContext& ctx) const override {
    const at::Tensor x = gather_along(group_, in[0], dim_, forward_use(ctx, "sequence parallelism's all-gather (forward)"));
    return {at::linear(x, in[1], has_bias_ ? in[2] : at::Tensor())};
  }
  TensorList backward(const BackwardArgs& a) const override {
    const at::Tensor& g = a.grad_outputs[0];
    const int64_t d_out = a.input_sizes(1)[0], d_in = a.input_sizes(1)[1];
    TensorList grads(a.needs_input_grad.size());
    if (a.needs_input_grad[1]) {
      const at::Tensor x = gather_along(group_, a.inputs[0], dim_, "sequence parallelism's all-gather again (backward)");
      grads[1] = g.reshape({-1, d_out}).t().mm(x.reshape({-1, d_in}));
    }
    if (a.needs_input_grad[0]) {
      grads[0] = scatter_along(group_, at::matmul(g, a.inputs[1]), dim_, "sequence parallelism's reduce-scatter (backward)");
    }
    if (has_bias_ && a.needs_input_grad[2]) grads[2] = g.reshape({-1, d_out}).sum(0);
    return grads;
  }

 private:
  static OpTraits traits_for(bool x_grad, bool w_grad) {
    OpTraits t = exchanging("tp_gather_linear").in_low_precision().doing(Work::kContraction);
    // The piece is saved for the weight's gradient (gathered again), the weight for the input's.
    t.saves_inputs = bit_if(w_grad, 0) | bit_if(x_grad, 1);
    return t;
  }
  TensorParallelGroup& group_;
  int64_t dim_;
  bool has_bias_;
};

// Rows [first, first + rows) of the vocabulary's embedding: a token outside them gives zeros, so
// the group's sum (g) is the whole lookup. Local: no exchange.
class VocabEmbeddingOp final : public Op {
 public:
  explicit VocabEmbeddingOp(int64_t first) : Op(OpTraits::named("vocab_parallel_embedding").saving_inputs({1}).with_low_precision_output()),
        first_(first) {}

  TensorList forward(const TensorList& in, const ForwardContext&) const override {
    const auto [local, outside] = local_rows(in[1], in[0].size(0));
    return {detail::embedding_rows(in[0], local).masked_fill_(outside.unsqueeze(-1), 0)};
  }
  TensorList backward(const BackwardArgs& a) const override {
    const auto [local, outside] = local_rows(a.inputs[1], a.input_sizes(0)[0]);
    const at::Tensor g = a.grad_outputs[0].masked_fill(outside.unsqueeze(-1), 0);
    return {detail::embedding_rows_backward(g, local, a.input_sizes(0)[0]), at::Tensor()};
  }

 private:
  // Masks of bools combined bitwise, not logically: the same bits, and kernels that libtorch 1.13
  // also has for meta tensors (a step traced without data, runtime/op.h).
  std::pair<at::Tensor, at::Tensor> local_rows(const at::Tensor& indices, int64_t rows) const {
    at::Tensor local = indices - first_;
    at::Tensor outside = local.lt(0).bitwise_or_(local.ge(rows));
    return {local.masked_fill_(outside, 0), outside};
  }
  int64_t first_;
};

// Mean cross entropy over N rows whose logits are split by columns: this rank holds columns
// [first, first + valid) of the vocabulary (and padding after them, which takes no part). The
// rows' maxima (all-gathered), sums of exponentials and targets' logits (all-reduced) are the only
// exchanges: the whole logits never exist on one rank. Outputs (loss, log-sum-exp per row).
class VocabCrossEntropyOp final : public Op {
 public:
  VocabCrossEntropyOp(TensorParallelGroup& group, int64_t first, int64_t valid)
      : Op(traits()), group_(group), first_(first), valid_(valid) {}

  TensorList forward(const TensorList& in, const ForwardContext& ctx) const override {
    const at::Tensor x = masked(in[0]);
    const auto [target, mine] = local_targets(in[1], x.size(1));
    at::Tensor maxima = std::get<0>(x.max(1));
    const at::Tensor every_maximum =
        gather_along(group_, maxima.unsqueeze(0), 0, forward_use(ctx, "the cross entropy's row maxima"));
    maxima = std::get<0>(every_maximum.max(0));
    at::Tensor sums = summed(group_, at::exp(x - maxima.unsqueeze(1)).sum(1),
                             forward_use(ctx, "the cross entropy's sums of exponentials"));
    const at::Tensor picked = x.gather(1, target.unsqueeze(1)).squeeze(1).masked_fill_(mine.bitwise_not(), 0);
    const at::Tensor target_logits = summed(group_, picked, forward_use(ctx, "the cross entropy's target logits"));
    at::Tensor lse = sums.log_().add_(maxima);
    return {(lse - target_logits).mean(), lse};
  }
  TensorList backward(const BackwardArgs& a) const override {
    const at::Tensor x = masked(a.inputs[0]);
    const auto [target, mine] = local_targets(a.inputs[1], x.size(1));
    // softmax - one-hot: -1 at each row's target where this rank holds it. Every allocation here
    // has the same size on every rank of the group, so that memory, and so DTR's choices, stay alike.
    at::Tensor p = at::exp(x - a.outputs[1].unsqueeze(1));
    p.scatter_add_(1, target.unsqueeze(1), mine.to(p.scalar_type()).neg_().unsqueeze(1));
    p.mul_(a.grad_outputs[0] / static_cast<double>(x.size(0)));
    return {p.to(a.input_dtype(0)), at::Tensor()};
  }

 private:
  static OpTraits traits() {
    OpTraits t = exchanging("vocab_parallel_cross_entropy").saving_inputs({0, 1}).saving_outputs({1}).in_float32();
    return t;
  }
  // A copy of the logits with the padding's columns at -inf, which exp() makes 0. A copy on
  // every rank, padded or not: the same allocations everywhere.
  at::Tensor masked(const at::Tensor& logits) const {
    at::Tensor x = logits.clone();
    if (valid_ < logits.size(1)) x.narrow(1, valid_, logits.size(1) - valid_).fill_(-std::numeric_limits<double>::infinity());
    return x;
  }
  // Each row's target as a column of this rank (0 where it is another's), and whether it is ours.
  std::pair<at::Tensor, at::Tensor> local_targets(const at::Tensor& target, int64_t) const {
    at::Tensor local = target - first_;
    at::Tensor mine = local.ge(0).bitwise_and_(local.lt(valid_));
    return {local.masked_fill_(mine.bitwise_not(), 0), mine};
  }
  TensorParallelGroup& group_;
  int64_t first_, valid_;
};

}  // namespace

Tensor tp_copy(const Tensor& x) {
  return detail::apply_first(std::make_shared<CopyToGroupOp>(group_of(x, "tp_copy")), {x});
}

Tensor tp_reduce(const Tensor& x) {
  return detail::apply_first(std::make_shared<ReduceFromGroupOp>(group_of(x, "tp_reduce")), {x});
}

Tensor tp_reduce_scatter(const Tensor& x, int64_t dim) {
  return detail::apply_first(
      std::make_shared<ReduceScatterOp>(group_of(x, "tp_reduce_scatter"), detail::normalize_dim(dim, x.dim())), {x});
}

Tensor tp_gather_linear(const Tensor& x, int64_t dim, const Tensor& weight, const Tensor& bias) {
  TORCH_CHECK(weight.dim() == 2, "tp_gather_linear: weight must be (D_out, D_in), got ", weight.sizes());
  auto op = std::make_shared<GatherLinearOp>(group_of(x, "tp_gather_linear"), detail::normalize_dim(dim, x.dim()),
                                             bias.defined(), x.requires_grad(), weight.requires_grad());
  if (bias.defined()) return detail::apply_first(std::move(op), {x, weight, bias});
  return detail::apply_first(std::move(op), {x, weight});
}

Tensor vocab_parallel_embedding(const Tensor& weight, const Tensor& indices, int64_t first_row) {
  return detail::apply_first(std::make_shared<VocabEmbeddingOp>(first_row), {weight, indices});
}

Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& target, int64_t first, int64_t valid) {
  TORCH_CHECK(logits.dim() == 2 && target.dim() == 1 && target.size(0) == logits.size(0),
              "vocab_parallel_cross_entropy: logits (N, K) and target (N) expected, got ", logits.sizes(), " and ",
              target.sizes());
  TORCH_CHECK(valid >= 0 && valid <= logits.size(1), "vocab_parallel_cross_entropy: ", valid,
              " valid columns of ", logits.size(1));
  return detail::apply_first(
      std::make_shared<VocabCrossEntropyOp>(group_of(logits, "vocab_parallel_cross_entropy"), first, valid),
      {logits, target});
}

}  // namespace ht

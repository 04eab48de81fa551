// Context parallelism's attention, with the group's keys and values gathered (issue 68, Part 1;
// Llama 3's own choice for long context). Each rank of the context group holds its pieces of the
// sequence (runtime/context_parallel.h); its queries attend to the whole sequence's keys:
// - forward all-gathers the group's keys and values (the key/value heads, never the query heads
//   they serve: grouped-query attention makes them small), puts them in sequence order and runs
//   the blockwise kernel (runtime/ops/attention.cpp) with each query at its position, so causal
//   masking cuts each block at its own last query;
// - it saves this rank's keys and values, never the gathered ones: backward gathers them again,
//   and reduce-scatters their gradients, summed over the query blocks in fp32, so each rank gets
//   the sum of every rank's queries' contributions to its keys.
// What the tape holds is O(T / c) per rank; the gathered keys and values (and their gradients'
// fp32 sums in backward) live only while the kernel runs.
//
// The exchange makes it a collective (runtime/tensor_parallel.h): DTR with modelled costs may drop
// its output and run it again, gather included, on every rank of the group at the same point.
#include "runtime/ops/attention_kernels.h"
#include "runtime/ops/op_util.h"

#include <cmath>

namespace ht {
namespace {

using detail::AttentionConfig;
using TensorList = std::vector<at::Tensor>;

// This rank's keys or values (B, Hkv, T / c, hd), every rank's gathered in sequence order:
// (B, Hkv, T, hd).
at::Tensor gathered(TensorParallelGroup& group, const ContextLayout& layout, const at::Tensor& part,
                    const char* what) {
  const at::Tensor dense = part.contiguous();
  at::Tensor buffer = at::empty({group.size() * dense.numel()}, dense.options());
  group.all_gather(dense.view(-1), buffer, what);
  std::vector<int64_t> stacked = dense.sizes().vec();
  stacked.insert(stacked.begin(), group.size());
  return layout.in_sequence_order(buffer.view(stacked), 2).contiguous();
}

// The group's sum of every rank's `whole` (B, Hkv, T, hd) in sequence order: this rank's part,
// (B, Hkv, T / c, hd), in `type`.
at::Tensor scattered(TensorParallelGroup& group, const ContextLayout& layout, const at::Tensor& whole,
                     at::ScalarType type, const char* what) {
  const at::Tensor stacked = layout.by_rank(whole, 2).contiguous();  // (c, B, Hkv, T / c, hd)
  at::Tensor part = at::empty(stacked.sizes().slice(1), whole.options());
  group.reduce_scatter_sum(stacked.view(-1), part, what);
  return part.to(type);
}

class ContextAttentionOp final : public Op {
 public:
  ContextAttentionOp(TensorParallelGroup& group, const ContextLayout& layout, const AttentionConfig& cfg)
      : Op(traits_for(cfg, layout.ranks)), group_(group), layout_(layout), cfg_(cfg) {}

  TensorList forward(const TensorList& in, const ForwardContext& ctx) const override {
    const bool again = ctx.recompute;
    const at::Tensor k = gathered(group_, layout_, in[1], again ? "recomputation" : "context parallelism's key all-gather (forward)");
    const at::Tensor v = gathered(group_, layout_, in[2], again ? "recomputation" : "context parallelism's value all-gather (forward)");
    return detail::blockwise_attention_forward(in[0], k, v, cfg_);
  }

  TensorList backward(const BackwardArgs& a) const override {
    if (!a.grad_outputs[0].defined()) return TensorList(3);  // only the hidden lse had one
    const at::Tensor k = gathered(group_, layout_, a.inputs[1], "context parallelism's key all-gather (backward)");
    const at::Tensor v = gathered(group_, layout_, a.inputs[2], "context parallelism's value all-gather (backward)");
    TensorList grads = detail::blockwise_attention_backward_sums(a, k, v, cfg_);
    if (grads[1].defined()) {
      grads[1] = scattered(group_, layout_, grads[1], a.input_dtype(1), "context parallelism's key-gradient reduce-scatter (backward)");
    }
    if (grads[2].defined()) {
      grads[2] = scattered(group_, layout_, grads[2], a.input_dtype(2), "context parallelism's value-gradient reduce-scatter (backward)");
    }
    return grads;
  }

 private:
  static OpTraits traits_for(const AttentionConfig& cfg, int64_t ranks) {
    OpTraits t = OpTraits::named("context_attention")
                     .saving_inputs({0, 1, 2})
                     .saving_outputs({0, 1})
                     .in_low_precision()
                     .exchanging_with_its_group()
                     .attending_to_the_keys_of(ranks);
    t.doing(cfg.causal ? Work::kCausalAttention : Work::kAttention);
    if (cfg.dropout_p > 0) t.drawing_random_numbers();
    return t;
  }

  TensorParallelGroup& group_;
  ContextLayout layout_;
  AttentionConfig cfg_;
};

}  // namespace

Tensor context_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double dropout_p,
                         bool training, std::optional<double> scale) {
  TensorParallelGroup* group = q.interp().context_parallel();
  if (group == nullptr || group->size() == 1) return attention(q, k, v, causal, dropout_p, training, scale);
  TORCH_CHECK(q.interp().mode() == ExecutionMode::kInterpreted,
              "context_attention: runs in interpreted mode only (its backward is a collective)");
  detail::check_attention_shapes(q, k, v, causal, dropout_p);
  const ContextLayout layout{group->size(), group->rank()};
  TORCH_CHECK(q.size(2) == k.size(2),
              "context_attention: a rank's queries are its keys' positions, got T = ", q.size(2), ", S = ", k.size(2));
  const int64_t length = k.size(2) * layout.ranks;
  const std::string problem = layout.problem(length);
  TORCH_CHECK(problem.empty(), "context_attention: ", problem);
  AttentionConfig cfg;
  cfg.causal = causal;
  cfg.dropout_p = training ? dropout_p : 0.0;
  cfg.scale = scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(3))));
  cfg.pieces = layout.pieces(length);
  if (cfg.dropout_p > 0) cfg.seed = q.interp().next_seed();
  return detail::apply_first(std::make_shared<ContextAttentionOp>(*group, layout, cfg), {q, k, v});
}

}  // namespace ht

// Context parallelism's attention, with the group's keys and values gathered (issue 68, Part 1;
// Llama 3's own choice for long context; the ring is runtime/ops/ring_attention.cpp). Each rank of the context group holds its pieces of the
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
// Its outputs are never dropped to be made again (OpTraits::recomputable false), under any memory
// policy: a recomputation would repeat the gather, which every rank of the group must then do at
// the same point, and the ranks of a context group do not choose alike. Tensor parallelism's
// ranks run the same kernels on the same shapes, so DTR with modelled costs decides alike on each
// and may recompute their collectives; a context group's ranks do not: under causal masking each
// block of queries reads the keys up to its own position, so rank r's blocks make score blocks of
// other sizes than rank r + 1's, their arenas fill differently, and DTR evicts other tensors on
// each (measured: two ranks of a Llama under a 4 MB budget met in different collectives at the
// first step's backward). What DTR may drop and regenerate are the op's inputs (q, k, v: the
// rotations and projections before it, which exchange nothing) and everything after it; the
// output and its log-sum-exp stay, (B, T / c, H, hd) and (B, H, T / c) per layer.
#include "runtime/ops/attention_kernels.h"
#include "runtime/ops/op_util.h"

#include <cmath>
#include <functional>

namespace ht {
namespace {

using detail::AttentionConfig;
using TensorList = std::vector<at::Tensor>;

// Every rank's keys or values (B, Hkv, T / c, hd), as the group's all-gather leaves them: rank r's
// at index r of (c, B, Hkv, T / c, hd).
at::Tensor gathered_by_rank(TensorParallelGroup& group, const at::Tensor& part, const char* what) {
  const at::Tensor dense = part.contiguous();
  at::Tensor buffer = at::empty({group.size() * dense.numel()}, dense.options());
  group.all_gather(dense.view(-1), buffer, what);
  std::vector<int64_t> stacked = dense.sizes().vec();
  stacked.insert(stacked.begin(), group.size());
  return buffer.view(stacked);
}

// The group's sum of every rank's `whole` (B, Hkv, T, hd) in sequence order: this rank's part,
// (B, Hkv, T / c, hd), in whole's type.
at::Tensor scattered(TensorParallelGroup& group, const ContextLayout& layout, const at::Tensor& whole, const char* what) {
  const at::Tensor stacked = layout.by_rank(whole, 2).contiguous();  // (c, B, Hkv, T / c, hd)
  at::Tensor part = at::empty(stacked.sizes().slice(1), whole.options());
  group.reduce_scatter_sum(stacked.view(-1), part, what);
  return part;
}

// The exchanges of one kernel call, kept until the call ends. A kernel that finds no room is run
// again from its start (runtime/memory_hooks.h, run_with_room), and the ranks of a context group
// do not run out of room at the same points (their causal blocks differ in size): a rank running
// its kernel again takes the results of the exchanges it made already, and makes only those the
// others have not seen yet, so every rank exchanges once per call, in the same order.
class ExchangeLog {
 public:
  void attempt_begins() { next_ = 0; }
  void call_ends() {
    kept_.clear();
    next_ = 0;
  }
  // The result of the attempt's next exchange: `exchange()`'s, or the one an earlier attempt made.
  // `exchange` allocates what it needs, exchanges, and returns what the collective filled, before
  // anything else allocates: a kernel that finds no room after it finds it kept.
  at::Tensor next(const std::function<at::Tensor()>& exchange) {
    if (next_ == kept_.size()) kept_.push_back(exchange());
    return kept_[next_++];
  }

 private:
  std::vector<at::Tensor> kept_;
  size_t next_ = 0;
};

class ContextAttentionOp final : public Op {
 public:
  ContextAttentionOp(TensorParallelGroup& group, const ContextLayout& layout, const AttentionConfig& cfg)
      : Op(detail::context_attention_traits("context_attention", cfg, layout.ranks)), group_(group), layout_(layout), cfg_(cfg) {}

  TensorList forward(const TensorList& in, const ForwardContext&) const override {
    forward_log_.attempt_begins();
    const at::Tensor k = in_order(forward_log_.next([&] {
      return gathered_by_rank(group_, in[1], "context parallelism's key all-gather (forward)");
    }));
    const at::Tensor v = in_order(forward_log_.next([&] {
      return gathered_by_rank(group_, in[2], "context parallelism's value all-gather (forward)");
    }));
    TensorList out = detail::blockwise_attention_forward(in[0], k, v, cfg_);
    forward_log_.call_ends();
    return out;
  }

  TensorList backward(const BackwardArgs& a) const override {
    if (!a.grad_outputs[0].defined()) return TensorList(3);  // only the hidden lse had one
    backward_log_.attempt_begins();
    const at::Tensor k = in_order(backward_log_.next([&] {
      return gathered_by_rank(group_, a.inputs[1], "context parallelism's key all-gather (backward)");
    }));
    const at::Tensor v = in_order(backward_log_.next([&] {
      return gathered_by_rank(group_, a.inputs[2], "context parallelism's value all-gather (backward)");
    }));
    TensorList grads = detail::blockwise_attention_backward_sums(a, k, v, cfg_);
    // The sums over every rank's queries, in fp32 (double for double inputs), then the inputs' type.
    if (grads[1].defined()) {
      grads[1] = backward_log_.next([&] {
        return scattered(group_, layout_, grads[1], "context parallelism's key-gradient reduce-scatter (backward)");
      }).to(a.input_dtype(1));
    }
    if (grads[2].defined()) {
      grads[2] = backward_log_.next([&] {
        return scattered(group_, layout_, grads[2], "context parallelism's value-gradient reduce-scatter (backward)");
      }).to(a.input_dtype(2));
    }
    backward_log_.call_ends();
    return grads;
  }

 private:
  // The gathered (c, B, Hkv, T / c, hd) in sequence order: (B, Hkv, T, hd).
  at::Tensor in_order(const at::Tensor& by_rank) const { return layout_.in_sequence_order(by_rank, 2).contiguous(); }

  TensorParallelGroup& group_;
  ContextLayout layout_;
  AttentionConfig cfg_;
  mutable ExchangeLog forward_log_, backward_log_;  // forward and backward each run once per op
};

}  // namespace

namespace detail {

OpTraits context_attention_traits(const char* name, const AttentionConfig& cfg, int64_t ranks) {
  OpTraits t = OpTraits::named(name)
                   .saving_inputs({0, 1, 2})
                   .saving_outputs({0, 1})
                   .in_low_precision()
                   .exchanging_with_its_group()
                   .attending_to_the_keys_of(ranks);
  t.recomputable = false;
  t.doing(cfg.causal ? Work::kCausalAttention : Work::kAttention);
  if (cfg.dropout_p > 0) t.drawing_random_numbers();
  return t;
}

}  // namespace detail

Tensor context_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double dropout_p,
                         bool training, std::optional<double> scale, ContextExchange exchange) {
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
  if (exchange == ContextExchange::kRing) return detail::apply_first(detail::ring_attention_op(*group, layout, cfg), {q, k, v});
  return detail::apply_first(std::make_shared<ContextAttentionOp>(*group, layout, cfg), {q, k, v});
}

}  // namespace ht

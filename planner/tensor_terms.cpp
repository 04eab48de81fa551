#include "planner/tensor_terms.h"

#include "planner/profile.h"

#include <cstdio>
#include <vector>

namespace ht {

TensorShape tensor_shape(const DecoderOptions& o) {
  TensorShape s;
  s.llama = o.is_llama();
  s.layers = o.n_layer;
  s.hidden = o.n_embd;
  s.sequence = o.block_size;
  s.heads = o.n_head;
  s.kv_heads = o.kv_heads();
  s.mlp_hidden = o.mlp_hidden();
  s.padded_vocab = o.padded_vocab();
  return s;
}

TensorTraffic tensor_parallel_traffic(const TensorShape& s, int64_t micro_batch, int t, bool sp) {
  TensorTraffic x;
  x.sequence_parallel = sp;
  if (t <= 1 || !s.defined()) return x;
  const int64_t e = micro_batch * s.sequence * s.hidden;  // one activation: b s h
  const int64_t rows = micro_batch * s.sequence;
  auto allreduce = [&](int64_t n, int64_t calls = 1) {
    x.allreduce_elements += n * calls;
    x.allreduce_calls += calls;
  };
  auto gather = [&](int64_t n, int64_t calls = 1) {
    x.allgather_elements += n * calls;
    x.allgather_calls += calls;
  };
  auto scatter = [&](int64_t n, int64_t calls = 1) {
    x.reducescatter_elements += n * calls;
    x.reducescatter_calls += calls;
  };
  const int64_t layers = s.layers;
  if (!sp) {
    // Embedding: g forward. Each layer: g after attention and after the MLP forward, f before each
    // backward. The head: f before the output layer, backward.
    allreduce(e, 1 + 2 * layers);
    allreduce(e, 2 * layers + 1);
    x.forward_activation_elements = e * (1 + 2 * layers);
    x.backward_activation_elements = e * (2 * layers + 1);
  } else {
    // Embedding: reduce-scatter forward, all-gather backward. Each layer: the all-gathering linear
    // and the reduce-scatter of attention and of the MLP forward; backward, each gathering linear
    // gathers its input again and reduce-scatters its gradient, each reduce-scatter all-gathers.
    // The head: a gathering linear.
    scatter(e, 1 + 2 * layers);
    gather(e, 2 * layers + 1);
    x.forward_activation_elements = e * (1 + 4 * layers + 1);
    gather(e, 1 + 2 * layers + 2 * layers + 1);      // backward of the reduce-scatters, and re-gathers
    scatter(e, 2 * layers + 1);                      // the gathering linears' input gradients
    x.backward_activation_elements = e * (6 * layers + 3);
    x.regathered_elements = e * (2 * layers + 1);
    // Weights read on sequence pieces (f): the norms' (and GPT-2's biases of the row-parallel
    // layers and positions), their gradients summed over the group.
    const int64_t norms = 2 * layers + 1;
    allreduce(s.hidden, norms * (s.llama ? 1 : 2));
    if (!s.llama) {
      allreduce(s.hidden, 2 * layers);
      allreduce(s.sequence * s.hidden);
    }
  }
  // The vocabulary-parallel cross entropy: the rows' maxima gathered, their sums and the targets'
  // logits summed.
  gather(rows * t);
  allreduce(rows, 2);
  return x;
}

double tensor_parallel_ms(const Machine& machine, int t, const TensorTraffic& x, int64_t activation_bytes) {
  if (t <= 1) return 0;
  const double gbps = machine.intra_node_gbps, alpha_ms = machine.intra_node_latency_us * 1e-3;
  // Activation-sized elements go in all-reduces without sequence parallelism, in all-gathers and
  // reduce-scatters with it; the rest (norm weights, the loss's row statistics) in fp32.
  const int64_t activations = x.forward_activation_elements + x.backward_activation_elements;
  const int64_t reduced_activations = x.sequence_parallel ? 0 : activations;
  const double reduced = static_cast<double>(reduced_activations) * activation_bytes +
                         static_cast<double>(x.allreduce_elements - reduced_activations) * 4;
  const double moved = static_cast<double>(activations - reduced_activations) * activation_bytes +
                       static_cast<double>(x.allgather_elements + x.reducescatter_elements -
                                           (activations - reduced_activations)) * 4;
  // A ring: each rank sends (t - 1) / t of a whole tensor for an all-gather or a reduce-scatter,
  // twice that for an all-reduce, in t - 1 (2 (t - 1)) messages.
  const double ring = static_cast<double>(t - 1) / t;
  const double bytes = (2.0 * reduced + moved) * ring;
  const double messages = static_cast<double>(t - 1) *
                          static_cast<double>(2 * x.allreduce_calls + x.allgather_calls + x.reducescatter_calls);
  return messages * alpha_ms + bytes / (gbps * 1e9) * 1e3;
}

int64_t layer_activation_bytes(const TensorShape& s, int64_t b, int t, bool sp, std::string* why,
                               int64_t element_bytes) {
  const int64_t bs = b * s.sequence, h = s.hidden, hd = s.hidden / s.heads;
  const int64_t piece = sp && t > 1 ? bs / t : bs;  // rows of the replicated region on a rank
  const int64_t q = bs * s.heads / t * hd, kv = bs * s.kv_heads / t * hd, f = bs * s.mlp_hidden / t;
  // Activations in the compute type (`element_bytes`); the per-row statistics in fp32. Each
  // item is one tensor (one arena block). Attention's output is laid out (B, T, H, hd), so the
  // output projection's input (the heads merged) is a view of it, not a copy; SwiGLU's product
  // is one op that keeps w13's output and recomputes silu(gate) in backward.
  struct Item {
    const char* what;
    int64_t elements;
    int64_t bytes_each;
  };
  const int64_t a = element_bytes;
  // Made, not assigned: GCC 12 warns of a null memmove in assigning an initializer list.
  const std::vector<Item> items = s.llama ? std::vector<Item>{{"the attention norm's input", piece * h, a},
             {"  its reciprocal RMS (fp32)", piece, 4},
             {"the attention norm's output (wqkv's input)", piece * h, a},
             {"rotated queries", q, a},
             {"rotated keys", kv, a},
             {"the values' copy", kv, a},
             {"attention's output (wo's input, the heads merged as a view)", q, a},
             {"  its log-sum-exp (fp32)", bs * s.heads / t, 4},
             {"the MLP norm's input", piece * h, a},
             {"  its reciprocal RMS (fp32)", piece, 4},
             {"the MLP norm's output (w13's input)", piece * h, a},
             {"w13's output: gate and up (SwiGLU's input)", 2 * f, a},
             {"SwiGLU's output (w2's input)", f, a}}
                                          : std::vector<Item>{{"the attention norm's input", piece * h, a},
             {"  its mean and 1/std (fp32)", 2 * piece, 4},
             {"the attention norm's output (wqkv's input)", piece * h, a},
             {"wqkv's output (queries, keys and values, kept by their views)", q + 2 * kv, a},
             {"attention's output (wo's input, the heads merged as a view)", q, a},
             {"  its log-sum-exp (fp32)", bs * s.heads / t, 4},
             {"the MLP norm's input", piece * h, a},
             {"  its mean and 1/std (fp32)", 2 * piece, 4},
             {"the MLP norm's output (fc's input)", piece * h, a},
             {"fc's output (GELU's input)", f, a},
             {"GELU's output (proj's input)", f, a}};
  int64_t bytes = 0;
  std::string text;
  for (const Item& i : items) {
    if (i.elements == 0) continue;
    bytes += arena_bytes(i.bytes_each * i.elements);
    if (why != nullptr) {
      char line[160];
      std::snprintf(line, sizeof line, "  %-64s %lld\n", i.what, static_cast<long long>(i.bytes_each * i.elements));
      text += line;
    }
  }
  if (why != nullptr) *why = text;
  return bytes;
}

}  // namespace ht

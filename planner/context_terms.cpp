#include "planner/context_terms.h"

#include <algorithm>

namespace ht {

int64_t ContextTraffic::sent_bytes(int c, int64_t activation_bytes) const {
  if (exchange == ContextExchange::kRing) return chunk_elements * (activation_passes * activation_bytes + gradient_passes * 4);
  // A ring all-gather or reduce-scatter: each rank sends (c - 1) / c of the whole.
  return (gathered_elements * activation_bytes + scattered_elements * 4) * (c - 1) / c;
}

ContextTraffic context_traffic(const TensorShape& s, int64_t micro_batch, int c, ContextExchange exchange, int tensor) {
  ContextTraffic x;
  x.exchange = exchange;
  if (c <= 1 || !s.defined()) return x;
  const int64_t hd = s.hidden / s.heads, kv_heads = s.kv_heads / std::max(1, tensor);
  x.chunk_elements = 2 * micro_batch * kv_heads * (s.sequence / c) * hd;
  if (exchange == ContextExchange::kRing) {
    x.activation_passes = 2 * (c - 1) * s.layers;  // forward, and again backward
    x.gradient_passes = c * s.layers;
  } else {
    // Keys and values gathered forward and again backward (one collective each), their
    // gradients reduce-scattered: the whole sequence's, c chunks, each time.
    x.gathered_elements = 2 * c * x.chunk_elements * s.layers;
    x.scattered_elements = c * x.chunk_elements * s.layers;
    x.collectives = 6 * s.layers;
  }
  return x;
}

double attention_share(const TensorShape& s) {
  if (!s.defined()) return 0;
  const double h = static_cast<double>(s.hidden), hd = h / static_cast<double>(s.heads);
  const double q = static_cast<double>(s.heads) * hd, kv = static_cast<double>(s.kv_heads) * hd;
  const double f = static_cast<double>(s.mlp_hidden);
  // Per token: the projections' and the MLP's GEMMs, and attention against half the sequence.
  const double linear = h * (q + 2 * kv) + q * h + (s.llama ? 3 : 2) * h * f;
  const double attention = 2 * q * static_cast<double>(s.sequence) / 2;
  return attention / (attention + linear);
}

double context_parallel_ms(const Machine& machine, int c, int stride, const TensorShape& s, const ContextTraffic& x,
                           int64_t activation_bytes, bool overlapped, double attention_forward_ms,
                           double attention_backward_ms) {
  if (c <= 1 || !s.defined()) return 0;
  const RingLink link = ring_link(machine, c, stride);
  const double alpha_ms = link.latency_us * 1e-3, ms_per_byte = 1e3 / (link.gbps * 1e9);
  if (x.exchange == ContextExchange::kAllGather) {
    return static_cast<double>(x.collectives) * (c - 1) * alpha_ms +
           static_cast<double>(x.sent_bytes(c, activation_bytes)) * ms_per_byte;
  }
  // A layer's c steps: step k passes the next chunk (k < c - 1) and, backward, the sums of the
  // step before (k > 0) while it attends to its chunk (1/c of the layer's attention); backward's
  // last sums come home after the last step, in the open.
  const double layers = static_cast<double>(s.layers);
  const double chunk_ms = alpha_ms + static_cast<double>(x.chunk_elements * activation_bytes) * ms_per_byte;
  const double sums_ms = alpha_ms + static_cast<double>(x.chunk_elements * 4) * ms_per_byte;
  const double forward_step = overlapped ? attention_forward_ms / layers / c : 0;
  const double backward_step = overlapped ? attention_backward_ms / layers / c : 0;
  double wait = 0;
  for (int k = 0; k < c; ++k) {
    const double sent_forward = k + 1 < c ? chunk_ms : 0;
    const double sent_backward = (k + 1 < c ? chunk_ms : 0) + (k > 0 ? sums_ms : 0);
    wait += std::max(0.0, sent_forward - forward_step) + std::max(0.0, sent_backward - backward_step);
  }
  return layers * (wait + sums_ms);
}

}  // namespace ht

// Context parallelism's time terms (planner/context_terms.h) against what the ops exchange
// (runtime/ops/ring_attention.cpp, context_attention.cpp, counted by ContextAttention.* and
// ContextParallelJob.*) and how the ring hides its passes under the attention.
#include "planner/context_terms.h"

#include <gtest/gtest.h>

namespace ht::test::context_terms_tests {

TensorShape llama(int64_t sequence) {
  TensorShape s;
  s.layers = 2;
  s.hidden = 32;
  s.sequence = sequence;
  s.heads = 8;
  s.kv_heads = 4;
  s.mlp_hidden = 96;
  s.padded_vocab = 256;
  return s;
}

// The bytes the job test reads from context_bytes: per layer and micro-batch, the ring passes 3c - 2
// chunks of 2 b Hkv (T / c) hd elements, the gathered variant 6 wholes of b Hkv T hd (a rank sends
// (c - 1) / c of each).
TEST(ContextTerms, TrafficIsWhatTheOpsExchange) {
  const TensorShape s = llama(16);
  const int64_t kv = 8 * 4 * 16 * 4;  // b Hkv T hd
  for (int c : {2, 4}) {
    const ContextTraffic ring = context_traffic(s, 8, c, ContextExchange::kRing);
    EXPECT_EQ(ring.chunk_elements, 2 * kv / c);
    EXPECT_EQ(ring.activation_passes + ring.gradient_passes, 2 * (3 * c - 2));  // two layers
    EXPECT_EQ(ring.sent_bytes(c, 4), 2 * (3 * c - 2) * (2 * kv / c) * 4);
    const ContextTraffic gathered = context_traffic(s, 8, c, ContextExchange::kAllGather);
    EXPECT_EQ(gathered.gathered_elements + gathered.scattered_elements, 2 * 6 * kv);
    EXPECT_EQ(gathered.sent_bytes(c, 4), 2 * 6 * kv * 4 * (c - 1) / c);
  }
  EXPECT_EQ(context_traffic(s, 8, 1, ContextExchange::kRing).sent_bytes(1, 4), 0);
}

// Where the backend moves a ring's pass while the rank attends to its chunk, with attention longer
// than a pass only the last gradient sums of each layer wait; with none to hide under, or where the
// passes wait for the attention (today's backends), every pass waits.
TEST(ContextTerms, TheRingHidesItsPassesUnderTheAttention) {
  Machine m;
  m.devices_per_node = 8;
  m.intra_node_gbps = 1;
  m.intra_node_latency_us = 0;
  const TensorShape s = llama(4096);
  const int c = 4;
  const ContextTraffic ring = context_traffic(s, 1, c, ContextExchange::kRing);
  const double chunk_ms = static_cast<double>(ring.chunk_elements * 2) / 1e9 * 1e3;  // bf16
  const double sums_ms = static_cast<double>(ring.chunk_elements * 4) / 1e9 * 1e3;
  const double open = context_parallel_ms(m, c, 1, s, ring, 2, true, 0, 0);
  EXPECT_NEAR(open, s.layers * (2 * (c - 1) * chunk_ms + c * sums_ms), 1e-9);
  const double hidden = context_parallel_ms(m, c, 1, s, ring, 2, true, 1e6, 1e6);
  EXPECT_NEAR(hidden, s.layers * sums_ms, 1e-9);
  EXPECT_NEAR(context_parallel_ms(m, c, 1, s, ring, 2, false, 1e6, 1e6), open, 1e-9);
  // A forward step's attention covering half a pass: half of each forward pass waits.
  const double forward_half = s.layers * c * chunk_ms / 2;
  const double partly = context_parallel_ms(m, c, 1, s, ring, 2, true, forward_half, 0);
  EXPECT_NEAR(open - partly, s.layers * (c - 1) * chunk_ms / 2, 1e-9);
  const ContextTraffic gathered = context_traffic(s, 1, c, ContextExchange::kAllGather);
  EXPECT_NEAR(context_parallel_ms(m, c, 1, s, gathered, 2, true, 1e6, 1e6),
              static_cast<double>(gathered.sent_bytes(c, 2)) / 1e9 * 1e3, 1e-9);  // nothing hidden
  // Attention's share of a layer's work grows with the sequence.
  EXPECT_LT(attention_share(llama(512)), attention_share(llama(4096)));
  EXPECT_GT(attention_share(llama(4096)), 0.5);
}

}  // namespace ht::test::context_terms_tests

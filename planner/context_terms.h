#pragma once
// Context parallelism (parallel.context_parallel = c, parallel.context_exchange) in a prediction.
// Plain functions of a decoder's shape and the layout, as planner/tensor_terms.h's:
// - memory: a profile of a context-parallel plan is one rank's (launcher/planning/profiler.cpp
//   profiles rank 0's chunks of each sequence with its context group mirrored), so its activations
//   (1/c of every sequence's) and what its attention holds while it runs (the ring's two chunks of
//   keys and values, or the whole sequence's gathered ones) are measured, not modelled.
// - time: the attention's exchanges of one micro-batch, a layer at a time (context_traffic()), over
//   the group's link. The ring passes a chunk of keys and values c - 1 times forward and again
//   backward, and their gradients' fp32 sums c times. Each pass is posted before the rank attends
//   to the chunk it holds; where the backend moves it meanwhile (`overlapped`), only what the
//   attention's time does not cover waits. Today none does: MPI progresses a large message only
//   inside its calls, and NCCL's sends run on the compute stream, so the cost model prices every
//   pass in the open. The gathered variant all-gathers keys and values forward and again backward
//   and reduce-scatters their fp32 gradients, in the open.

#include "planner/machine.h"
#include "planner/tensor_terms.h"
#include "runtime/context_parallel.h"

#include <cstdint>

namespace ht {

// One rank's exchanges in one micro-batch, every layer together.
struct ContextTraffic {
  ContextExchange exchange = ContextExchange::kRing;
  int64_t chunk_elements = 0;          // one rank's keys and values of a layer: 2 b Hkv (s / c) hd
  int64_t activation_passes = 0;       // ring: passes of chunks of keys and values (activation type)
  int64_t gradient_passes = 0;         // ring: passes of their gradients' sums (fp32)
  int64_t gathered_elements = 0;       // all_gather: the whole of each gather (activation type)
  int64_t scattered_elements = 0;      // all_gather: the whole of each reduce-scatter (fp32)
  int64_t collectives = 0;             // all_gather: the calls
  // Bytes this rank sends, at `activation_bytes` an element of keys and values.
  int64_t sent_bytes(int c, int64_t activation_bytes) const;
};

ContextTraffic context_traffic(const TensorShape& shape, int64_t micro_batch, int c, ContextExchange exchange,
                               int tensor = 1);

// The share of a decoder layer's forward multiply-adds that are its attention's (the scores and
// their product with the values, under causal masking half of them): what a ring's passes hide
// under. The same at every c: a rank's queries are 1/c of them, and so are its rows of every GEMM.
double attention_share(const TensorShape& shape);

// The exchanges' time in one micro-batch's forward and backward that the rank waits for (ms):
// the ring's passes, `overlapped`, less the attention they hide under (its forward and backward,
// every layer together, `attention_forward_ms` and `attention_backward_ms`); the gathers' whole.
// The group's ranks are `stride` apart in the job's rank order (the tensor-parallel degree).
double context_parallel_ms(const Machine& machine, int c, int stride, const TensorShape& shape,
                           const ContextTraffic& traffic, int64_t activation_bytes, bool overlapped,
                           double attention_forward_ms, double attention_backward_ms);

}  // namespace ht

#pragma once
// The collectives of tensor parallelism as the runtime sees them. A layer split across the ranks
// of a tensor-parallel group (parallel.tensor_parallel) runs ops whose kernels exchange with the
// group: Megatron's f and g, sequence parallelism's all-gather and reduce-scatter, and the
// vocabulary-parallel cross entropy (runtime/ops.h, "Tensor parallelism"). The runtime declares
// this interface and parallel/ implements it over a Communicator, as with ParameterSource:
// runtime/ sits below parallel/ and may not know its types.
//
// Every rank of the group runs the same ops in the same order, so every rank calls the same
// collectives at the same points, forward and backward. An op whose forward exchanges is declared
// a collective (OpTraits::collective): under DTR with modelled costs, whose choices are the same on
// every rank of the group, its outputs may be evicted and the exchange runs again, on every rank
// at the same point, in their regeneration; under any other policy the interpreter keeps them
// (Interpreter::set_keep_collectives, training/engine.h: keeps_collectives) and a recomputation
// stops at them.

#include <ATen/core/Tensor.h>

#include <memory>

namespace ht {

// A message passed round a group (TensorParallelGroup::pass_along_ring), under way: its tensors
// stay alive and untouched until wait() returns. wait() may be called again (it returns at once).
class RingPass {
 public:
  virtual ~RingPass() = default;
  virtual void wait() = 0;
};

class TensorParallelGroup {
 public:
  virtual ~TensorParallelGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place; `t` contiguous. `what` names the use in error messages and in the byte counts.
  virtual void allreduce_sum(at::Tensor& t, const char* what) = 0;
  // Every rank's `shard` (contiguous, n elements) into `full` (contiguous, size() x n elements),
  // rank r's at offset r x n.
  virtual void all_gather(const at::Tensor& shard, at::Tensor& full, const char* what) = 0;
  // The sum over the group of every rank's `full` (size() x n elements); this rank's part,
  // elements [rank x n, (rank + 1) x n), into `shard`.
  virtual void reduce_scatter_sum(const at::Tensor& full, at::Tensor& shard, const char* what) = 0;
  // Sends `out` (contiguous) to rank (rank() + 1) mod size() and receives rank (rank() - 1) mod
  // size()'s, of out's shape and type, into `in` (contiguous, apart from out). Posted now and
  // complete at the pass's wait(), so the caller computes meanwhile (context parallelism's ring:
  // runtime/ops/ring_attention.cpp). Every rank posts its passes in the same order.
  virtual std::unique_ptr<RingPass> pass_along_ring(const at::Tensor& out, at::Tensor& in, const char* what) = 0;
};

}  // namespace ht

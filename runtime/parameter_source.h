#pragma once
// Where a weight's data comes from when it is not always resident: sharded parameters
// (parallel.shard = "parameters", parallel/parameter_shards.h) keep each rank's share only, and
// gather a bucket's whole parameters from every rank just before a kernel reads one of them.
// The interpreter asks before every read of a weight (a forward kernel, a recomputation, a
// backward entry), on the thread running them; every rank runs the same ops in the same order,
// so every rank asks at the same points and the gathers match. null: weights are always resident.

#include <ATen/core/Tensor.h>

namespace ht {

class MemoryHooks;

class ParameterSource {
 public:
  virtual ~ParameterSource() = default;
  // `weight` (a parameter's at::Tensor, as given to Interpreter::param) is about to be read: make
  // its data resident. Memory it needs comes through `memory` (run_with_room: the memory manager
  // may evict activations to make room).
  virtual void before_read(const at::Tensor& weight, MemoryHooks& memory) = 0;
};

}  // namespace ht

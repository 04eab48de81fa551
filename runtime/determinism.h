#pragma once
// Training is bit-identical with or without a budget's recomputations, and across a resume. On a
// GPU that takes kernels that give the same bits every run: cuDNN's deterministic algorithms (no
// benchmarking), cuBLAS with a fixed workspace, and ATen's deterministic variants where an op
// has one. An op without one (max pooling's backward on CUDA adds with atomics) only warns:
// there bit-identity is not promised. Called before any kernel runs (cuBLAS reads its workspace
// setting when its first handle is made); costs some speed.

#include <ATen/Context.h>

#include <cstdlib>

namespace ht {

inline void use_deterministic_cuda_kernels() {
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  at::globalContext().setDeterministicCuDNN(true);
  at::globalContext().setBenchmarkCuDNN(false);
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
}

}  // namespace ht

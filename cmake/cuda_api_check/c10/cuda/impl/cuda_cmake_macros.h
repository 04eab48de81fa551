#pragma once
// Stands in for the header libtorch's build generates and Debian's libtorch-dev leaves out, so
// that its CUDA headers can be compiled against (cmake/HtCudaApiCheck.cmake). Never linked.
#define C10_CUDA_BUILD_SHARED_LIBS

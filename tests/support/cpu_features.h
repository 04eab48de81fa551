#pragma once
// What this CPU gives libtorch 1.13's oneDNN. Its bf16 products and convolutions, and the
// convolution workspaces runtime/kernel_workspace.cpp declares, were measured on AVX-512's core
// (F, BW, DQ, VL); without it oneDNN takes other kernels: bf16 products that round differently
// and convolutions with other scratchpads. Tests that hold those numbers exactly say so and skip.

#include <fstream>
#include <string>

namespace ht::test {

inline bool cpu_has_avx512_core() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("flags", 0) != 0) continue;
    line += " ";
    for (const char* flag : {" avx512f ", " avx512bw ", " avx512dq ", " avx512vl "}) {
      if (line.find(flag) == std::string::npos) return false;
    }
    return true;
  }
  return false;
}

inline constexpr const char* kWithoutAvx512 =
    "this CPU lacks AVX-512's core: oneDNN takes other bf16 and convolution kernels than the ones measured";

}  // namespace ht::test

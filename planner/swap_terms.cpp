#include "planner/swap_terms.h"

#include "memory/host_swap.h"

#include <algorithm>
#include <vector>

namespace ht {
namespace {

const int64_t kMinSwapBytes = SwapOptions{}.min_bytes;  // the runtime's own threshold

// The values backward reads that host swap may copy (producer that can run again, 64 KiB or
// more), and whether a convolution or matmul made or reads each.
struct Candidates {
  std::vector<char> saved, heavy;
};

Candidates candidates_of(const StepTrace& trace) {
  Candidates c{std::vector<char>(trace.tensors.size(), 0), std::vector<char>(trace.tensors.size(), 0)};
  for (const TraceKernel& k : trace.kernels) {
    if (!k.backward) continue;
    for (int t : k.inputs) {
      const TraceTensor& tensor = trace.tensors[static_cast<size_t>(t)];
      if (tensor.producer < 0 || tensor.bytes < kMinSwapBytes) continue;
      const TraceKernel& producer = trace.kernels[static_cast<size_t>(tensor.producer)];
      if (!producer.recomputable) continue;
      c.saved[static_cast<size_t>(t)] = 1;
      if (k.heavy || producer.heavy) c.heavy[static_cast<size_t>(t)] = 1;
    }
  }
  return c;
}

}  // namespace

void swap_terms(const StepTrace& trace, MemoryPolicy policy, const Machine& machine, double slowdown,
                bool evicts, int64_t accumulation, Prediction& p) {
  const Candidates c = candidates_of(trace);
  const double bytes_per_ms = std::max(machine.host_link_gbps, 1e-6) * 1e6;
  double forward_ms = 0, backward_ms = 0;
  for (const TraceKernel& k : trace.kernels) (k.backward ? backward_ms : forward_ms) += k.ms * slowdown;
  std::vector<std::vector<size_t>> made_by(trace.kernels.size());  // each kernel's candidates
  for (size_t t = 0; t < trace.tensors.size(); ++t) {
    if (c.saved[t]) made_by[static_cast<size_t>(trace.tensors[t].producer)].push_back(t);
  }
  // Forward in order: when each kernel ends, the values it made join the link's queue.
  int64_t out_bytes = 0;
  double clock = 0, link_free = 0;
  for (const TraceEvent& e : trace.events) {
    if (e.kind != TraceEvent::Kind::kKernelEnds) continue;
    const TraceKernel& k = trace.kernels[static_cast<size_t>(e.index)];
    if (k.backward) break;
    clock += k.ms * slowdown;
    for (size_t t : made_by[static_cast<size_t>(e.index)]) {
      const double end = std::max(link_free, clock) + static_cast<double>(trace.tensors[t].bytes) / bytes_per_ms;
      const bool copy = policy == MemoryPolicy::kSwap ? c.heavy[t] != 0 : end <= forward_ms;
      if (!copy) continue;
      out_bytes += trace.tensors[t].bytes;
      link_free = end;
    }
  }
  const double out_ms = static_cast<double>(out_bytes) / bytes_per_ms;
  const double in_ms = evicts ? out_ms : 0;
  const auto n = static_cast<double>(accumulation);
  p.swap_out_bytes = out_bytes * accumulation;
  p.swap_link_ms = (out_ms + in_ms) * n;
  p.swap_exposed_ms = (std::max(0.0, out_ms - forward_ms) + std::max(0.0, in_ms - backward_ms)) * n;
}

}  // namespace ht

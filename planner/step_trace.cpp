#include "planner/step_trace.h"

#include <stdexcept>
#include <string>
#include <vector>

namespace ht {

void check_step_trace(const StepTrace& trace, const char* who) {
  auto check = [who](bool ok, const char* what, int index) {
    if (!ok) throw std::invalid_argument(std::string(who) + ": " + what + " (index " + std::to_string(index) + ")");
  };
  const auto nt = static_cast<int>(trace.tensors.size()), nk = static_cast<int>(trace.kernels.size());
  for (int t = 0; t < nt; ++t) {
    const int p = trace.tensors[t].producer;
    check(trace.tensors[t].bytes >= 0 && p >= -1 && p < nk, "a tensor has negative bytes or no such producer", t);
  }
  for (int k = 0; k < nk; ++k) {
    for (int in : trace.kernels[k].inputs) check(in >= 0 && in < nt, "a kernel reads no such tensor", k);
  }
  std::vector<char> allocated(nt, 0), freed(nt, 0), began(nk, 0);
  for (const TraceEvent& e : trace.events) {
    const bool kernel = e.kind == TraceEvent::Kind::kKernelBegins || e.kind == TraceEvent::Kind::kKernelEnds;
    check(e.index >= 0 && e.index < (kernel ? nk : nt), "an event names no such tensor or kernel", e.index);
    if (e.kind == TraceEvent::Kind::kAllocated) {
      const int p = trace.tensors[e.index].producer;
      check(!allocated[e.index] && (p < 0 || began[p]), "a tensor is allocated twice or before its producer", e.index);
      allocated[e.index] = 1;
    } else if (e.kind == TraceEvent::Kind::kFreed) {
      check(allocated[e.index] && !freed[e.index], "a tensor is freed twice or before it is allocated", e.index);
      freed[e.index] = 1;
    } else if (e.kind == TraceEvent::Kind::kKernelBegins) {
      check(!began[e.index], "a kernel begins twice", e.index);
      began[e.index] = 1;
      for (int in : trace.kernels[e.index].inputs) check(allocated[in], "a kernel reads an unborn tensor", e.index);
    }
  }
}

}  // namespace ht

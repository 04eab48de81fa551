#pragma once
// Where a step's kernel time goes, by op, measured: the run's side of the planner's "time by op"
// (planner/plan_report.cpp), so that a predicted step that misses the measured one names the ops
// that miss (metrics.time_by_op; docs/planner.md). The interpreter adds each forward kernel, each
// regeneration and each backward kernel as it runs; on a GPU the kernel's CUDA events are kept and
// read when the step's times are taken, which waits for the GPU once, at the step's end, never per
// kernel. On the CPU, the host's clock around each kernel.

#include "runtime/kernel_timer.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace ht {

class OpTimeLog {
 public:
  enum class Pass { kForward, kRecompute, kBackward };
  // One kernel of op `op` (OpTraits::name, a literal), timed by `timer` (stopped).
  void add(const char* op, Pass pass, const KernelTimer& timer);
  // Milliseconds by op since the last take ("linear", "linear backward", "gelu recomputed"), and
  // the log emptied. Reads every kernel's events: waits for the last kernel to finish.
  std::map<std::string, double> take_ms();
  void clear() { kernels_.clear(); }  // the kernels so far forgotten, unread
  size_t pending() const { return kernels_.size(); }

 private:
  struct Kernel {
    const char* op;
    Pass pass;
    double host_ms;
    std::shared_ptr<DeviceKernelTime> device;  // null on the CPU
  };
  std::vector<Kernel> kernels_;
};

// The op's name in OpTimeLog::take_ms's keys.
std::string op_time_key(const char* op, OpTimeLog::Pass pass);

}  // namespace ht

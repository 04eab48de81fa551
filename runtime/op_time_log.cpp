#include "runtime/op_time_log.h"

namespace ht {

std::string op_time_key(const char* op, OpTimeLog::Pass pass) {
  switch (pass) {
    case OpTimeLog::Pass::kForward: return op;
    case OpTimeLog::Pass::kRecompute: return std::string(op) + " recomputed";
    case OpTimeLog::Pass::kBackward: return std::string(op) + " backward";
  }
  return op;
}

void OpTimeLog::add(const char* op, Pass pass, const KernelTimer& timer) {
  kernels_.push_back(Kernel{op, pass, timer.host_ms(), timer.device_time()});
}

std::map<std::string, double> OpTimeLog::take_ms() {
  std::map<std::string, double> ms;
  for (Kernel& k : kernels_) ms[op_time_key(k.op, k.pass)] += k.device ? k.device->ms() : k.host_ms;
  kernels_.clear();
  return ms;
}

}  // namespace ht

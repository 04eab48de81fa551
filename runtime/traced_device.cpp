#include "runtime/traced_device.h"

namespace ht {
namespace {
thread_local bool traced_for_gpu = false;
}  // namespace

TracedForGpu::TracedForGpu(bool gpu) : previous_(traced_for_gpu) { traced_for_gpu = gpu; }
TracedForGpu::~TracedForGpu() { traced_for_gpu = previous_; }
bool TracedForGpu::current() { return traced_for_gpu; }

}  // namespace ht

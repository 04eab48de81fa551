#pragma once
// One training micro-batch (forward and backward) as the device memory saw it, as plain data:
// every block allocated during it, every op call (kernel) with the blocks it reads, and the
// order of allocations, frees and kernels. planner/step_recorder.h records it from a profiled
// step; planner/dtr_replay.h replays it through an eviction policy at a smaller budget (the DTR
// paper's simulator approach, with our own sizes and times).

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

namespace ht {

// A block of device memory allocated during the step.
struct TraceTensor {
  int64_t bytes = 0;   // its block in the arena (CpuArena::rounded_size of the request)
  int producer = -1;   // index of the forward kernel whose output it is; -1: not regenerable
                       // (gradients, temporaries, the batch)
  bool low_end = false;  // allocated while a forward kernel ran: an activation (CpuArena::end_for places it)
};

// The element type a kernel computes in (its first floating-point input's): what a contraction's
// rate on a device depends on (planner/op_time.h).
enum class KernelType : uint8_t { kFloat, kBf16, kFp16 };

struct TraceKernel {
  const char* op = "?";      // the op's name (OpTraits::name: a literal), for messages
  double ms = 0;             // measured time of the kernel
  double modeled_ms = 0;     // its modelled cost (runtime/kernel_cost.h); forward kernels only
  // Its work (runtime/kernel_cost.h, KernelWork): what planner/op_time.h prices on a device. A
  // backward's is derived from its forward's (StepRecorder: the kernels' gradients' rule).
  double flops = 0;
  double bytes = 0;
  KernelType type = KernelType::kFloat;
  std::vector<int> inputs;   // trace tensors it reads (forward: its inputs; backward: saved values)
  bool backward = false;     // a tape entry's backward, not a forward op
  bool recomputable = true;  // forward ops only: may its outputs be dropped and regenerated?
  bool heavy = false;        // a convolution or a contraction (host swap's vDNN rule copies around them)
  // How a device runs it beside the curves (planner/op_time.h): attention's fused kernels (by
  // their query length; 0: not attention), a 16-bit contraction off the 8-element alignment, a
  // type-converting memory-bound loop.
  int64_t attention_length = 0;
  bool misaligned = false;
  bool converts = false;
  // Backward only: the buckets (cut at blocks, ModelProfile::block_buckets) of the parameters
  // whose gradients it makes, where the recorder was told them (StepRecorder::set_gradient_buckets).
  std::vector<int> gradient_buckets;
  int block = -1;            // the model block whose forward ran it (or ran the forward it is the
                             // backward of); -1: outside the blocks (the loss)
};

// A forward cast that reads no traced tensor: autocast's cast of a weight (a parameter is not a
// trace tensor) to the compute dtype, made per micro-batch where training.compute_weights casts
// (planner/weight_copy_terms.h). Its output is held until backward's product reads it.
inline bool is_weight_cast(const TraceKernel& k) {
  return !k.backward && k.inputs.empty() && std::strcmp(k.op, "cast") == 0;
}

struct TraceEvent {
  enum class Kind : uint8_t { kKernelBegins, kKernelEnds, kAllocated, kFreed };
  Kind kind;
  int index;  // kernel index (kKernel*) or tensor index (kAllocated, kFreed)
};

struct StepTrace {
  // Bytes in the arena when the step began and never freed during it (parameters, gradients,
  // optimizer state): the arena's high end, rounded as the arena rounds.
  int64_t persistent_bytes = 0;
  std::vector<TraceTensor> tensors;
  std::vector<TraceKernel> kernels;
  std::vector<TraceEvent> events;
};

// Throws std::invalid_argument, its message led by `who`, unless every index is in range and each
// tensor is allocated once, after its producer began and before it is read or freed: then
// lineage runs backwards in time and regenerating from it cannot loop.
void check_step_trace(const StepTrace& trace, const char* who);

// A step at a plan's sizes, shared and never changed (planner/cost_model.h: shared_trace_for),
// and what makes one where a term needs it (a walk along it that is not known yet).
using SharedTrace = std::shared_ptr<const StepTrace>;
using TraceMaker = std::function<SharedTrace()>;

}  // namespace ht

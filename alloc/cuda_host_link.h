#pragma once
// The host link on a GPU (issue 67 part 2): host swap, per-block offload and the optimizer state
// on host copy over it as over CPU ranks' modelled link (host_link.h), with the GPU's copy
// engines doing the work:
// - one copy stream each way, so copies out, copies in and the kernels overlap;
// - a copy starts after an event recorded on the compute stream (ATen's current stream) when it
//   is asked for: behind the kernel that last wrote its source;
// - CopyJob::wait() makes the compute stream wait for the copy's event; the host goes on, and the
//   copy lets go of its device end (a block freed after that is reused by the compute stream only
//   behind the copy);
// - a copy holds its host end until its event has passed (done()), and its device end until then
//   or until wait(), so neither the arena nor the pinned host allocator hands them on under it
//   (what record_stream does for PyTorch's caching allocator);
// - host ends are pinned (ATen's pinned host allocator), as the copy engines need for copies
//   that do not block;
// - bf16 compression converts on the copy stream, through a staging buffer of the link's own per
//   direction (cudaMalloc, outside the budget's arena, as large as the largest narrow copy);
// - its rate is measured when the first link of the GPU is made (64 MiB each way, the slower
//   direction: cuda_host_link_gbps), and the swap's rule and the planner price copies by it;
// - CopyJob::finish() waits on the host (cudaEventSynchronize): an eviction that needs the host
//   copy valid, and the optimizer state read on the host, wait so.
// Built where libtorch has CUDA; make_cuda_host_link throws elsewhere (no_cuda_arena.cpp).

#include "alloc/host_link.h"

#include <memory>

namespace ht {

// The link between host memory and GPU `device`. `gbps` > 0 prices copies at that rate instead of
// the measured one (the run's memory.host_link_gbps where the config sets it).
std::shared_ptr<HostLink> make_cuda_host_link(int device, double gbps = 0);
// The link's rate, GB/s each way (the slower), measured once per GPU per process: what a link made
// with gbps = 0 prices copies at, and what the planner prices them at on this GPU
// (launcher/planning/planned_here.cpp). Throws where the measurement cannot be made (no pinned
// host memory, a CUDA error), and without CUDA.
double cuda_host_link_gbps(int device);

}  // namespace ht

#pragma once
// The CUDA side of NCCL's communicator (nccl_communicator.cpp): ATen's current stream, and the
// communication stream as StreamCollectives drives it (parallel/stream_collectives.h). Built with
// NCCL; the stream guard needs libtorch with CUDA (HT_TORCH_CUDA).

#include "parallel/stream_collectives.h"

#include <memory>

struct CUstream_st;  // cudaStream_t's and cudaEvent_t's, kept out of this header
struct CUevent_st;

namespace ht {

// ATen's current stream on `device` where libtorch has CUDA; otherwise the legacy default stream,
// which every other blocking stream waits for.
CUstream_st* current_cuda_stream(int device);

// `side` as StreamCollectives' stream: follow_compute records `ready` on the current stream and
// makes `side` wait for it; enter() makes `side` ATen's current stream; record() and
// compute_waits() use events of their own. Null without libtorch's CUDA (ATen's current stream
// cannot be set there, so a job's kernels could not go to the stream).
std::shared_ptr<SideStream> make_cuda_side_stream(int device, CUstream_st* side, CUevent_st* ready);

}  // namespace ht
